"""Time the constraint stage (draft pruning and token masks) against the whole step, at 1
client and at 64, with and without speculation, from the server's own metrics.

Usage: thicket serve --port 8931 &  python3 benches/constraint_masks.py [BASE_URL]
"""

import json, re, sys, threading, urllib.request
BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8931"
SCHEMA = {"type":"object","properties":{"name":{"type":"string","maxLength":24},"country":{"type":"string","maxLength":24},"population_millions":{"type":"integer","minimum":0,"maximum":100}},"required":["name","country","population_millions"],"additionalProperties":False}
CITIES = ["Paris","Berlin","Rome","Madrid","Lisbon","Vienna","Prague","Oslo"]
def post(i, spec):
    body = {"messages":[{"role":"user","content":f"Describe the city of {CITIES[i%8]} as JSON."}],"max_tokens":64,"temperature":0,
            "speculation":{"method":spec}}
    body["response_format"]={"type":"json_schema","json_schema":{"name":"City","schema":SCHEMA}}
    req = urllib.request.Request(BASE+"/v1/chat/completions", data=json.dumps(body).encode(), headers={"content-type":"application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))
def metric(text, name):
    vals = {}
    for suffix in ("_sum","_count"):
        m = re.search(rf"^{name}{suffix} (\S+)$", text, re.M)
        vals[suffix] = float(m.group(1)) if m else 0.0
    return vals
def snap():
    t = urllib.request.urlopen(BASE+"/metrics").read().decode()
    return metric(t,"thicket_engine_constraint_duration_seconds"), metric(t,"thicket_engine_step_duration_seconds")
for clients in (1, 64):
    for spec in ("none","auto"):
        c0, s0 = snap()
        ts = [threading.Thread(target=post, args=(i, spec)) for i in range(clients if clients > 1 else 4)]
        if clients == 1:
            for t in ts: t.start(); t.join()
        else:
            for t in ts: t.start()
            for t in ts: t.join()
        c1, s1 = snap()
        cs, cn = c1["_sum"]-c0["_sum"], c1["_count"]-c0["_count"]
        ss, sn = s1["_sum"]-s0["_sum"], s1["_count"]-s0["_count"]
        print(f"clients {clients:2d} speculation {spec:4s}: steps {int(sn)}, constraint stage {1e3*cs/max(cn,1):.2f} ms/step, step {1e3*ss/max(sn,1):.2f} ms, share {100*cs/max(ss,1e-9):.1f}%")
