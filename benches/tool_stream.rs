//! What reading a streamed answer for tool calls costs, per token, against a plain stream:
//! for each `--tool-call-parser` format, a call that writes a 200-line Python file, in the
//! tokens Qwen2.5-Coder-0.5B's tokenizer cuts it into (fetched like the tests' model), goes
//! token by token through a plain stream (each token's chat chunk written as JSON) and
//! through the tool-call reader (`CallReader`: each piece it gives written as its chat chunk;
//! then the Messages API's check of how much of the arguments is settled), the two
//! alternating round by round. Printed per format: the tokens, both costs per token (means
//! over the rounds, and the reader's over the call's last tenth, where the most is rescanned),
//! the extra cost against one decoding row of the same model on this CPU (timed here), and how
//! many tokens after the one that completes the function's name the call starts (its id and
//! name sent), its first argument fragment arrives, and the first of the file's text.
//!
//! `cargo bench --bench tool_stream -- [MODEL]`

use std::time::Instant;

use api::server::tools::partial_json::settled;
use api::server::tools::{tool_format, CallReader, Calls, Piece, Tool};
use engine::{LogitRows, TokenTree, TreeBatch};
use kvcache::{BlockPool, BlockTable};
use serde_json::{json, Value};

const ROUNDS: usize = 20;
const CONTEXT: usize = 200;
const BLOCK: usize = 16;

/// A 200-line Python file.
fn file() -> String {
    (0..200)
        .map(|i| format!("def f{i}(x):\n    return x * {i} + \"{i}\"  # line {i}\n"))
        .collect()
}

/// The call writing `file` in `format`'s syntax.
fn answer(format: &str, file: &str) -> String {
    let path = "src/gen.py";
    let content = Value::String(file.to_string()).to_string();
    match format {
        "hermes" => format!(
            "<tool_call>\n{{\"name\": \"write_file\", \"arguments\": {{\"path\": \"{path}\", \"content\": {content}}}}}\n</tool_call>"
        ),
        "llama3_json" => format!(
            "{{\"name\": \"write_file\", \"parameters\": {{\"path\": \"{path}\", \"content\": {content}}}}}"
        ),
        "mistral" => format!(
            "[TOOL_CALLS][{{\"name\": \"write_file\", \"arguments\": {{\"path\": \"{path}\", \"content\": {content}}}}}]"
        ),
        _ => format!(
            "<tool_call>\n<function=write_file>\n<parameter=path>\n{path}\n</parameter>\n<parameter=content>\n{file}\n</parameter>\n</function>\n</tool_call>"
        ),
    }
}

/// A chat chunk carrying `delta`, as the stream writes it.
fn chunk(delta: Value) -> usize {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    .to_string()
    .len()
}

/// The chunk of a reader's piece.
fn piece_chunk(piece: &Piece) -> usize {
    match piece {
        Piece::Text(text) => chunk(json!({"content": text})),
        Piece::Call { call, .. } => chunk(json!({"tool_calls": [call]})),
        Piece::CallStart { index, id, name } => chunk(json!({"tool_calls": [{"index": index,
            "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]})),
        Piece::Arguments { index, text } => {
            chunk(json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]}))
        }
        Piece::CallEnd { .. } => 0,
    }
}

fn main() -> anyhow::Result<()> {
    let model = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let loaded = engine::load_model(&model, &Default::default())?;
    let tokenizer = &loaded.tokenizer;
    let row_ms = one_row_ms(&loaded)?;
    println!(
        "{model}, {}: one decoding row {row_ms:.2} ms (median)",
        engine::calibration::cpu_name()
    );
    let tool = Tool {
        name: "write_file".into(),
        parameters: json!({"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}}}),
        declaration: json!({}),
    };
    let file = file();
    println!("format       tokens  plain us/token  reader us/token  (last tenth)  extra/row  name->start  name->args  name->text");
    for format in ["hermes", "llama3_json", "mistral", "qwen3_coder"] {
        let calls = Calls::new(
            tool_format(format).map_err(anyhow::Error::msg)?,
            vec![tool.clone()],
        );
        let text = answer(format, &file);
        let ids = tokenizer.encode_plain(&text)?;
        let pieces: Vec<String> = ids
            .iter()
            .map(|&id| tokenizer.decode(&[id]))
            .collect::<Result<_, _>>()?;
        anyhow::ensure!(
            pieces.concat() == text,
            "{format}: tokens decode one by one"
        );
        let tenth = pieces.len() - pieces.len() / 10;
        // The token that completes the function's name.
        let marker = match format {
            "qwen3_coder" => "<function=write_file>",
            _ => "\"write_file\"",
        };
        let mut written = String::new();
        let name_at = pieces.iter().position(|p| {
            written.push_str(p);
            written.contains(marker)
        });
        let (mut plain, mut read, mut last) = (0.0, 0.0, 0.0);
        let mut delays = (None, None, None);
        let mut sink = 0usize;
        for round in 0..=ROUNDS {
            let t = Instant::now();
            for piece in &pieces {
                sink += chunk(json!({"content": piece}));
            }
            let plain_s = t.elapsed().as_secs_f64();
            let mut reader = CallReader::new(calls.clone());
            let mut arguments = String::new();
            let (mut named, mut first_args, mut first_text) = (None, None, None);
            let t = Instant::now();
            let mut tail = 0.0;
            for (i, piece) in pieces.iter().enumerate() {
                let at = Instant::now();
                for out in reader.push(piece) {
                    sink += piece_chunk(&out);
                    match &out {
                        Piece::CallStart { .. } => named = named.or(Some(i)),
                        Piece::Arguments { text, .. } => {
                            first_args = first_args.or(Some(i));
                            arguments.push_str(text);
                            sink += settled(&arguments);
                            if first_text.is_none() && arguments.contains("def f0") {
                                first_text = Some(i);
                            }
                        }
                        _ => {}
                    }
                }
                if i >= tenth {
                    tail += at.elapsed().as_secs_f64();
                }
            }
            for out in reader.finish() {
                sink += piece_chunk(&out);
            }
            let read_s = t.elapsed().as_secs_f64();
            if round > 0 {
                plain += plain_s;
                read += read_s;
                last += tail;
            }
            let after = |at: Option<usize>| Some(at? - name_at?);
            delays = (after(named), after(first_args), after(first_text));
        }
        let n = pieces.len() as f64;
        let per = |s: f64, tokens: f64| s / ROUNDS as f64 / tokens * 1e6;
        let extra_ms = (per(read, n) - per(plain, n)) / 1e3;
        let show = |d: Option<usize>| d.map_or("-".into(), |d| d.to_string());
        println!(
            "{format:<12} {:>6}  {:>14.2}  {:>15.2}  {:>12.2}  {:>8.3}%  {:>11}  {:>10}  {:>10}",
            pieces.len(),
            per(plain, n),
            per(read, n),
            per(last, (pieces.len() - tenth) as f64),
            extra_ms / row_ms * 100.0,
            show(delays.0),
            show(delays.1),
            show(delays.2),
        );
        std::hint::black_box(sink);
    }
    Ok(())
}

/// The median time of one decoding row of `loaded` at a 200-token context, in ms.
fn one_row_ms(loaded: &engine::LoadedModel) -> anyhow::Result<f64> {
    let mut pool = BlockPool::new((CONTEXT + 1).div_ceil(BLOCK), BLOCK);
    let mut table = BlockTable::new();
    anyhow::ensure!(table.ensure_capacity(CONTEXT + 1, &mut pool));
    let vocab = loaded.model.config().vocab_size as u32;
    let tokens: Vec<u32> = (0..CONTEXT as u32 + 1)
        .map(|i| (i.wrapping_mul(7919) + 13) % vocab)
        .collect();
    let mut backend = engine::backend::for_model(loaded.model.clone(), pool.num_slots())?;
    let mut prompt = TreeBatch::new(BLOCK);
    prompt.push(
        0,
        &table,
        &TokenTree::chain(&tokens[..CONTEXT]),
        LogitRows::Last,
    )?;
    backend.forward(&prompt)?;
    let mut one = TreeBatch::new(BLOCK);
    one.push(
        CONTEXT,
        &table,
        &TokenTree::chain(&tokens[CONTEXT..]),
        LogitRows::All,
    )?;
    let mut times: Vec<f64> = (0..40)
        .map(|_| {
            let t = Instant::now();
            backend
                .forward(&one)
                .map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
