//! `thicket bench forward`: the cost of one forward for N new tokens over a cached context,
//! as a markdown table (where the fused CPU pass runs, beside candle's ops on the same
//! weights), then the memory-bandwidth bound on one-row decoding measured in the same run.

use engine::LoadedModel;

/// Prints the forward-cost table.
pub fn run(
    loaded: &LoadedModel,
    context: usize,
    sizes: &[usize],
    (repeats, last_logits): (usize, bool),
) -> anyhow::Result<()> {
    println!(
        "CPU: {}; quantized matmul: {} kernel, {} path; layers: {}",
        engine::calibration::cpu_name(),
        match loaded.model.quant_kernel() {
            Some(engine::QuantKernel::Candle) => "candle",
            Some(engine::QuantKernel::Thicket) => "thicket",
            None => "none (dense weights)",
        },
        engine::cpu::qgemm::process_isa().name(),
        if loaded.model.is_fused() {
            "fused CPU pass"
        } else {
            "candle ops"
        }
    );
    println!();
    // Where the fused CPU pass runs, the same weights through candle's ops are measured in
    // the same run, interleaved, as the reference it replaces.
    let unfused = loaded
        .model
        .is_fused()
        .then(|| loaded.model.clone().without_fused_pass());
    let mut models = vec![&loaded.model];
    models.extend(unfused.as_ref());
    let logits = match last_logits {
        true => engine::LogitRows::Last,
        false => engine::LogitRows::All,
    };
    let curves = engine::calibration::forward_costs_of(&models, context, sizes, (repeats, logits))?;
    for curve in &curves {
        println!("Backend: {}", curve.backend);
    }
    println!();
    let points = &curves[0].points;
    let base = points.first().map(|p| p.seconds).unwrap_or(1.0);
    if let Some(candle) = curves.get(1) {
        let candle_base = candle.points.first().map(|p| p.seconds).unwrap_or(1.0);
        println!("| new tokens | ms / forward | x cost(1) | ms / token | matmul ms | attention ms | other ms | head ms | candle ops: ms | x cost(1) |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for ((p, parts), c) in points.iter().zip(&curves[0].parts).zip(&candle.points) {
            let parts = parts.unwrap_or_default();
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                p.new_tokens,
                p.seconds * 1e3,
                p.seconds / base,
                p.seconds * 1e3 / p.new_tokens as f64,
                parts.matmul * 1e3,
                parts.attention * 1e3,
                parts.other * 1e3,
                parts.head * 1e3,
                c.seconds * 1e3,
                c.seconds / candle_base
            );
        }
    } else {
        println!("| new tokens | ms / forward | x cost(1) | ms / token |");
        println!("|---:|---:|---:|---:|");
        for p in points {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} |",
                p.new_tokens,
                p.seconds * 1e3,
                p.seconds / base,
                p.seconds * 1e3 / p.new_tokens as f64
            );
        }
    }
    // The memory-bandwidth bound on one-row decoding, measured in the same run: a row reads
    // every weight, and the keys and values of its context too. It is the host's bandwidth,
    // so it bounds only a model on the CPU.
    if !loaded.model.device().is_cpu() {
        return Ok(());
    }
    let bandwidth = engine::calibration::read_bandwidth(1 << 30, 3);
    let weight_bytes = loaded.model.weight_bytes() as f64;
    // A windowed layer (a sliding window, a short convolution) reads its window only.
    let (full, windowed) = loaded.model.kv_bytes_per_position_split();
    let seen = context.min(loaded.model.kv_window().unwrap_or(context));
    let kv_bytes = (context * full + seen * windowed) as f64;
    let bound = bandwidth / weight_bytes;
    let with_kv = bandwidth / (weight_bytes + kv_bytes);
    let one_row = 1.0 / base;
    println!();
    println!(
        "memory read bandwidth {:.1} GB/s over {:.1} MB of weights: at most {bound:.1} forwards/s; one row measured {one_row:.1}/s = {:.0}% of that bound",
        bandwidth / 1e9,
        weight_bytes / 1e6,
        100.0 * one_row / bound
    );
    if kv_bytes > 0.0 {
        println!(
            "with the {:.1} MB of K/V (and windowed state) a row reads at a {context}-token context: at most {with_kv:.1} forwards/s, {:.0}% of that bound",
            kv_bytes / 1e6,
            100.0 * one_row / with_kv
        );
    }
    Ok(())
}
