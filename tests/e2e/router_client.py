"""Drives two `thicket serve` replicas through vllm-router with the official `openai` client.

Usage: router_client.py ROUTER_BASE REPLICA_A REPLICA_B VICTIM_PID MODEL

1. Chat, completions and a chat stream through the router.
2. 24 requests at once: both replicas must have served some (each one's own metrics).
3. 12 streams through the router; once every one has its first token and the victim replica
   (REPLICA_B, process VICTIM_PID) holds some of them, the victim gets SIGTERM. Every stream
   must still finish whole; once the victim has exited and the router's health check has
   seen it gone, requests are answered by the other replica.
Prints "router checks passed" at the end; any failure raises.
"""

import os
import re
import signal
import sys
import threading
import time

import httpx
import openai

ROUTER, REPLICA_A, REPLICA_B, VICTIM, MODEL = sys.argv[1:6]
client = openai.OpenAI(base_url=f"{ROUTER}/v1", api_key="unused", max_retries=0, timeout=120)


def finished_requests(replica):
    """Requests the replica has finished, from its own Prometheus metrics."""
    text = httpx.get(f"{replica}/metrics", timeout=10).text
    counts = re.findall(r"^thicket_request_e2e_latency_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(c) for c in counts)


def load(replica):
    return httpx.get(f"{replica}/get_load", timeout=10).json()["load"]


def wait_for_router():
    deadline = time.time() + 120
    while True:
        try:
            models = client.models.list()
            if any(m.id == MODEL for m in models.data):
                return
        except Exception as e:  # the router starts and finds its workers
            last = e
        if time.time() > deadline:
            raise SystemExit(f"the router never listed {MODEL}: {last!r}")
        time.sleep(0.5)


def basics():
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=12,
        temperature=0,
    )
    assert chat.choices[0].message.content, chat
    assert chat.usage.completion_tokens > 0, chat
    text = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0)
    assert text.choices[0].text, text
    assert text.choices[0].finish_reason in ("length", "stop"), text
    pieces, reasons = [], []
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert pieces and reasons in (["length"], ["stop"]), (pieces, reasons)
    # Greedy answers through the router equal the replica's own.
    direct = openai.OpenAI(base_url=f"{REPLICA_A}/v1", api_key="unused", max_retries=0)
    same = direct.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0)
    assert same.choices[0].text == text.choices[0].text, (same, text)
    print("chat, completions and streaming through the router: ok")


def both_replicas_serve():
    before = [finished_requests(r) for r in (REPLICA_A, REPLICA_B)]
    errors = []

    def one(i):
        try:
            r = client.completions.create(
                model=MODEL, prompt=f"Question {i}: what is {i} plus {i}?", max_tokens=6
            )
            assert r.choices[0].text is not None
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    served = [finished_requests(r) - b for r, b in zip((REPLICA_A, REPLICA_B), before)]
    print(f"24 requests under power_of_two: replicas finished {served}")
    assert all(s > 0 for s in served), f"a replica served nothing: {served}"
    assert sum(served) >= 24, served


def drain_one_replica():
    n = 12
    first = threading.Barrier(n + 1, timeout=120)
    results = [None] * n

    def stream(i):
        try:
            s = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Tell a long story about dragon number {i}."}],
                max_tokens=48,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            got_first, reasons, usage = False, [], None
            for chunk in s:
                if chunk.usage:
                    usage = chunk.usage
                for choice in chunk.choices:
                    if choice.delta.content and not got_first:
                        got_first = True
                        first.wait()
                    if choice.finish_reason:
                        reasons.append(choice.finish_reason)
            results[i] = (reasons, usage.completion_tokens if usage else None)
        except Exception as e:
            results[i] = e
            first.abort()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    first.wait()
    held = load(REPLICA_B)
    assert held > 0, "the victim holds none of the streams"
    os.kill(int(VICTIM), signal.SIGTERM)
    killed_at = time.time()
    # Draining: the victim says so at once.
    health = httpx.get(f"{REPLICA_B}/health", timeout=10)
    assert health.status_code == 503, health
    for t in threads:
        t.join()
    for i, r in enumerate(results):
        assert not isinstance(r, Exception), f"stream {i} failed: {r!r}"
        reasons, tokens = r
        assert reasons == ["length"] and tokens == 48, f"stream {i} was cut: {r}"
    print(f"SIGTERM with {held} of {n} streams on the victim: all {n} finished whole")
    # With its streams done the victim exits; once the router's health check has seen it
    # gone (1 s interval, one failure), new work goes to the other replica.
    deadline = time.time() + 60
    while True:
        try:
            httpx.get(f"{REPLICA_B}/health", timeout=2)
        except httpx.TransportError:
            break
        assert time.time() < deadline, "the drained replica did not exit"
        time.sleep(0.2)
    time.sleep(3)
    for i in range(4):
        r = client.completions.create(model=MODEL, prompt=f"After the drain {i}:", max_tokens=4)
        assert r.choices[0].text is not None
    print(f"requests after the drained replica exited answered ({time.time() - killed_at:.1f}s after the SIGTERM)")


wait_for_router()
basics()
both_replicas_serve()
drain_one_replica()
print("router checks passed")
