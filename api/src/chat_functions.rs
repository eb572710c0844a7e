//! What chat templates call beyond Jinja itself, as the Python renderers (transformers,
//! vLLM, llama.cpp) give it: `strftime_now(format)` (today's date and time, UTC),
//! `raise_exception(message)` (the template refusing a conversation, an error naming its
//! message), `tojson` as transformers writes JSON (Python's `json.dumps`: `", "` and `": "`
//! between items, keys in their order, no HTML escapes, `indent` on request), and Python's
//! methods on strings (`strip`, `split`, `startswith`, ...) and on dicts (`items`, `keys`,
//! `values`, `get`), from minijinja-contrib's `pycompat`.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

/// Adds the functions and methods to `env`.
pub fn install(env: &mut Environment<'_>) {
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("strftime_now", |format: String| {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        strftime(&format, seconds)
    });
    env.add_filter(
        "tojson",
        |value: Value, kwargs: Kwargs| -> Result<Value, Error> {
            let indent: Option<usize> = kwargs.get("indent")?;
            let json = serde_json::to_value(&value)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            let mut out = String::new();
            py_json(&json, indent, 0, &mut out);
            Ok(Value::from_safe_string(out))
        },
    );
    env.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        },
    );
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

/// The civil date (year, month 1-12, day 1-31) of `days` since 1970-01-01.
fn civil(days: i64) -> (i64, usize, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as usize, day)
}

/// `format` (C's `strftime` codes: `%Y %m %d %e %B %b %A %a %H %M %S %j %y %%`) at
/// `seconds` since the epoch, UTC; an unknown code is written as it is.
pub fn strftime(format: &str, seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let secs = seconds % 86_400;
    let (year, month, day) = civil(days);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[month - 1];
    let day_of_year = days - days_before_year(year) + 1;
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days from 1970-01-01 to January 1st of `year`.
fn days_before_year(year: i64) -> i64 {
    let y = year - 1;
    let leaps = |y: i64| y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400);
    365 * (year - 1970) + leaps(y) - leaps(1969)
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False, indent=indent)` writes it.
fn py_json(value: &serde_json::Value, indent: Option<usize>, level: usize, out: &mut String) {
    use serde_json::Value as J;
    let (items, open, close): (Vec<(Option<&String>, &J)>, char, char) = match value {
        J::Array(items) => (items.iter().map(|v| (None, v)).collect(), '[', ']'),
        J::Object(map) => (map.iter().map(|(k, v)| (Some(k), v)).collect(), '{', '}'),
        scalar => {
            out.push_str(&scalar.to_string());
            return;
        }
    };
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return;
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
    };
    for (i, (key, item)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, level + 1);
        if let Some(key) = key {
            out.push_str(&J::String(key.clone()).to_string());
            out.push_str(": ");
        }
        py_json(item, indent, level + 1, out);
    }
    newline(out, level);
    out.push(close);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_as_strftime_does() {
        // 2026-12-03 23:38:46 UTC, a Thursday; and the epoch.
        let t = 1_796_341_126;
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %a %B %b %j %y %e %% %Q", t),
            "2026-12-03 23:38:46 Thursday Thu December Dec 337 26  3 % %Q"
        );
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        // A leap day.
        assert_eq!(strftime("%Y-%m-%d %j", 951_782_400), "2000-02-29 060");
    }

    #[test]
    fn templates_call_python_methods_and_raise() {
        let mut env = Environment::new();
        install(&mut env);
        let t = "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|length }}\
                 {{ d.get('a') }}{{ d.get('z', 'none') }}{{ ' x '.strip() }}";
        let d = serde_json::json!({"a": 1, "b": "two"});
        let out = env
            .render_str(t, minijinja::context! { d => Value::from_serialize(&d) })
            .unwrap();
        assert_eq!(out, "a=1;b=two;21nonex");
        let err = env
            .render_str("{{ raise_exception('no system role') }}", ())
            .unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
        assert_eq!(
            env.render_str("{{ strftime_now('%Y')|length }}", ())
                .unwrap(),
            "4"
        );
        // tojson as json.dumps: keys in order, Python's separators, no HTML escapes.
        let v = serde_json::json!({"z": [1, 2.5, "<a & 'b'>é"], "a": {}, "m": {"k": null}});
        let ctx = minijinja::context! { v => Value::from_serialize(&v) };
        assert_eq!(
            env.render_str("{{ v|tojson }}", ctx.clone()).unwrap(),
            r#"{"z": [1, 2.5, "<a & 'b'>é"], "a": {}, "m": {"k": null}}"#
        );
        assert_eq!(
            env.render_str("{{ v.m|tojson(indent=2) }}", ctx).unwrap(),
            "{\n  \"k\": null\n}"
        );
    }
}
