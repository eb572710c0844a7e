//! What a format asks of a gpt-oss answer once its analysis is over (`super::harmony`): a
//! structured output (`response_format`, `structured_outputs`) is the body of a `final`
//! message, so its grammar is framed by that message's header; a thinking budget that ends
//! the analysis leaves the answer a `final` or `commentary` message (a call, or a preamble),
//! never a second analysis. The analysis itself is the engine's thinking phase, free of both.
//! A tool-call grammar (`super::tools::openai`) writes its own headers.

use engine::constraint::ConstraintSpec;

use crate::server::harmony::{CHANNEL, CONSTRAIN, MESSAGE, START};
use crate::server::tools::format::Markers;

/// The header before an answer's body: `<|start|>assistant` (which the prompt holds for
/// the reply's first message) and `<|channel|>`.
fn header(markers: &Markers<'_>) -> String {
    format!(
        "({start} \"assistant\")? {channel}",
        start = markers.write(START),
        channel = markers.write(CHANNEL)
    )
}

/// `inner` as the body of the answer's `final` message.
pub fn final_message(inner: ConstraintSpec, markers: &Markers<'_>) -> ConstraintSpec {
    ConstraintSpec::Framed {
        frame: format!(
            "start: {header} \"final\" {message} @inner\n",
            header = header(markers),
            message = markers.write(MESSAGE),
        ),
        inner: Box::new(inner),
    }
}

/// Any answer but another analysis: a `final` message, or a `commentary` one (to a
/// function, with its arguments' format named, or a preamble to the user), whose body holds
/// no header (where the markers are text, `<|` does not come in it).
pub fn after_analysis(markers: &Markers<'_>) -> ConstraintSpec {
    ConstraintSpec::Lark(format!(
        "start: {header} channel {message} BODY\n\
         channel: \"final\" | \"commentary\" RECIPIENT ({constrain} RECIPIENT)?\n\
         RECIPIENT: /[^<]*/\n\
         BODY: /([^<]|<+[^<|])*<*/\n",
        header = header(markers),
        message = markers.write(MESSAGE),
        constrain = markers.write(CONSTRAIN),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tools::format::as_text;

    #[test]
    fn the_frames_name_the_channels_and_keep_the_inner_format() {
        let markers = Markers::new(&as_text);
        let ConstraintSpec::Framed { frame, inner } =
            final_message(ConstraintSpec::JsonObject, &markers)
        else {
            panic!("not framed")
        };
        assert_eq!(*inner, ConstraintSpec::JsonObject);
        assert_eq!(
            frame,
            "start: (\"<|start|>\" \"assistant\")? \"<|channel|>\" \"final\" \"<|message|>\" @inner\n"
        );
        let id = |m: &str| (m == "<|message|>").then_some(7);
        let ConstraintSpec::Lark(after) = after_analysis(&Markers::new(&id)) else {
            panic!("not lark")
        };
        assert!(after.contains("\"final\" | \"commentary\""), "{after}");
        assert!(after.contains("channel <[7]> BODY"), "{after}");
        assert!(!after.contains("analysis"), "{after}");
    }
}
