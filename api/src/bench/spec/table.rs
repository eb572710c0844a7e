//! `thicket bench spec`'s table: per method (the first, `none`, the baseline) its speedup
//! per category, MAT, decoding tokens/s and the speedups in decoding, mean time to the first
//! token and end to end (each engine's wall time).

use engine::SpecMethod;

use super::Measurement;

/// Decoding speed: tokens after the first over the time after the first token.
pub(crate) fn tokens_per_second(ms: &[&Measurement]) -> f64 {
    let tokens: usize = ms.iter().map(|m| m.output_tokens.saturating_sub(1)).sum();
    let seconds: f64 = ms.iter().map(|m| m.decode_seconds).sum();
    tokens as f64 / seconds.max(1e-9)
}

/// Mean time to the first token.
pub(crate) fn mean_ttft(ms: &[&Measurement]) -> f64 {
    ms.iter().map(|m| m.ttft_seconds).sum::<f64>() / ms.len().max(1) as f64
}

/// Mean accepted tokens per verification step (1 without speculation).
pub(crate) fn mat(ms: &[&Measurement]) -> f64 {
    let steps: usize = ms.iter().map(|m| m.verify_steps).sum();
    let accepted: usize = ms.iter().map(|m| m.accepted_tokens).sum();
    if steps == 0 {
        1.0
    } else {
        (steps + accepted) as f64 / steps as f64
    }
}

/// Prints the table of `methods` (the first is the baseline, `none`) over `categories`.
pub(crate) fn print_table(
    methods: &[(SpecMethod, String)],
    categories: &[String],
    results: &[Measurement],
    busy: &[f64],
) {
    let select = |label: &str, category: Option<&str>| -> Vec<&Measurement> {
        results
            .iter()
            .filter(|m| m.method == label)
            .filter(|m| category.is_none_or(|c| m.category == c))
            .collect()
    };
    print!("| method |");
    for c in categories {
        print!(" {c} |");
    }
    println!(" MAT | tokens/s | speedup | TTFT | end to end |");
    print!("|---|");
    for _ in categories {
        print!("---:|");
    }
    println!("---:|---:|---:|---:|---:|");
    let none = methods[0].1.as_str();
    let base = select(none, None);
    let (base_all, base_ttft) = (tokens_per_second(&base), mean_ttft(&base));
    let base_busy = busy[0];
    for ((_, label), busy) in methods.iter().zip(busy) {
        let label = label.as_str();
        print!("| {label} |");
        for c in categories {
            let base = tokens_per_second(&select(none, Some(c)));
            let rate = tokens_per_second(&select(label, Some(c)));
            print!(" {:.2}x |", rate / base);
        }
        let all = select(label, None);
        let rate = tokens_per_second(&all);
        // TTFT and end to end as speedups too (the baseline's time over this method's), so
        // that above 1 is better in every column.
        println!(
            " {:.2} | {:.1} | {:.2}x | {:.2}x | {:.2}x |",
            mat(&all),
            rate,
            rate / base_all,
            base_ttft / mean_ttft(&all).max(1e-9),
            base_busy / busy.max(1e-9)
        );
    }
}
