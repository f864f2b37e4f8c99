//! What tool results look like to a model: exec events and downloaded files
//! turned into MCP content (text and images).

use base64::Engine;
use protocol::{Event, EventKind};
use rmcp::model::{CallToolResult, ContentBlock};

use crate::api::Download;

/// Image types of a MIME bundle that travel as MCP image content (base64 already).
const IMAGE_TYPES: [&str; 2] = ["image/png", "image/jpeg"];

/// An exec's events as one text block (stdout, stderr, result, displays,
/// errors, warnings, exit code) followed by one image block per picture in a
/// `result` or `display` bundle. A non-zero exit code makes it a tool error.
pub fn exec_result(sandbox_id: &str, events: &[Event]) -> CallToolResult {
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let (mut results, mut displays, mut errors, mut warnings) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut images = Vec::new();
    let mut exit = None;
    for ev in events {
        match ev.kind {
            EventKind::Stdout => push_line(&mut stdout, ev),
            EventKind::Stderr => push_line(&mut stderr, ev),
            EventKind::Result | EventKind::Display => {
                let text = ev.data.as_str().map(String::from);
                if let Some(bundle) = ev.bundle.as_ref().and_then(|b| b.as_object()) {
                    for mime in IMAGE_TYPES {
                        if let Some(data) = bundle.get(mime).and_then(|d| d.as_str()) {
                            images.push(ContentBlock::image(data, mime));
                        }
                    }
                }
                match ev.kind {
                    EventKind::Result => results.extend(text),
                    _ => displays.extend(text),
                }
            }
            EventKind::Error => errors.push(ev.data.as_str().map(String::from).unwrap_or_else(|| ev.data.to_string())),
            EventKind::Warning => warnings.push(ev.data.as_str().map(String::from).unwrap_or_else(|| ev.data.to_string())),
            EventKind::Exit => exit = ev.data.as_i64(),
        }
    }
    let mut text = String::new();
    section(&mut text, "stdout", &stdout);
    section(&mut text, "stderr", &stderr);
    section(&mut text, "result", &results.join("\n"));
    section(&mut text, "display", &displays.join("\n"));
    section(&mut text, "error", &errors.join("\n"));
    section(&mut text, "warning", &warnings.join("\n"));
    let ok = match exit {
        Some(code) => {
            text.push_str(&format!("exit code: {code} (sandbox {sandbox_id})"));
            code == 0
        }
        None => {
            text.push_str(&format!("the call ended without an exit code (sandbox {sandbox_id})"));
            false
        }
    };
    let mut content = vec![ContentBlock::text(text)];
    content.extend(images);
    if ok {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

fn push_line(out: &mut String, ev: &Event) {
    out.push_str(ev.data.as_str().unwrap_or_default());
    if ev.nl.unwrap_or(true) {
        out.push('\n');
    }
}

fn section(out: &mut String, name: &str, body: &str) {
    if body.is_empty() {
        return;
    }
    out.push_str(name);
    out.push_str(":\n");
    out.push_str(body);
    if !body.ends_with('\n') {
        out.push('\n');
    }
}

/// A downloaded file: an image as image content, UTF-8 text as text, other
/// bytes as base64 text. A note follows when only the first bytes were read.
pub fn download_result(path: &str, dl: &Download) -> CallToolResult {
    let whole = dl.bytes.len() as u64 >= dl.size;
    let mut content = Vec::new();
    if let (Some(mime), true) = (image_type(&dl.bytes), whole) {
        content.push(ContentBlock::text(format!("{path}: {mime}, {} bytes", dl.size)));
        content.push(ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(&dl.bytes), mime));
        return CallToolResult::success(content);
    }
    match std::str::from_utf8(&dl.bytes) {
        Ok(text) => content.push(ContentBlock::text(text)),
        // A cut in the middle of a character is still text.
        Err(e) if !whole && e.error_len().is_none() => content.push(ContentBlock::text(String::from_utf8_lossy(&dl.bytes[..e.valid_up_to()]))),
        Err(_) => content.push(ContentBlock::text(format!(
            "{path} is binary ({} bytes); base64 of {}:\n{}",
            dl.size,
            if whole { "all of it".to_string() } else { format!("the first {} bytes", dl.bytes.len()) },
            base64::engine::general_purpose::STANDARD.encode(&dl.bytes)
        ))),
    }
    if !whole {
        content.push(ContentBlock::text(format!(
            "[only the first {} of {} bytes of {path}; pass a larger max_bytes, or read it piecewise with run_bash (head, tail, sed)]",
            dl.bytes.len(),
            dl.size
        )));
    }
    CallToolResult::success(content)
}

/// The image type of `bytes` by their magic number, for the types MCP clients show.
fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(v: serde_json::Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    fn texts(r: &CallToolResult) -> Vec<String> {
        r.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect()
    }

    #[test]
    fn exec_sections_images_and_exit() {
        let events = [
            ev(json!({"type": "stdout", "data": "hi", "seq": 0, "ts": 0, "nl": true})),
            ev(json!({"type": "stdout", "data": "no newline", "seq": 1, "ts": 0, "nl": false})),
            ev(json!({"type": "display", "data": "<Pic>", "seq": 2, "ts": 0, "bundle": {"text/plain": "<Pic>", "image/png": "iVBO"}})),
            ev(json!({"type": "result", "data": "42", "seq": 3, "ts": 0, "bundle": {"text/plain": "42"}})),
            ev(json!({"type": "exit", "data": 0, "seq": 4, "ts": 0})),
        ];
        let r = exec_result("sb-x", &events);
        assert_eq!(r.is_error, Some(false));
        assert_eq!(texts(&r), ["stdout:\nhi\nno newline\nresult:\n42\ndisplay:\n<Pic>\nexit code: 0 (sandbox sb-x)"]);
        let image = r.content[1].as_image().expect("an image block");
        assert_eq!((image.data.as_str(), image.mime_type.as_str()), ("iVBO", "image/png"));
    }

    #[test]
    fn exception_is_a_tool_error() {
        let events = [
            ev(json!({"type": "stderr", "data": "ZeroDivisionError: division by zero", "seq": 0, "ts": 0, "nl": true})),
            ev(json!({"type": "error", "data": "ZeroDivisionError: division by zero", "seq": 1, "ts": 0, "ename": "ZeroDivisionError"})),
            ev(json!({"type": "exit", "data": 1, "seq": 2, "ts": 0})),
        ];
        let r = exec_result("sb-x", &events);
        assert_eq!(r.is_error, Some(true));
        assert!(texts(&r)[0].contains("error:\nZeroDivisionError: division by zero\nexit code: 1"), "{:?}", texts(&r));
    }

    #[test]
    fn downloads() {
        let text = download_result("/root/a", &Download { bytes: b"hello".to_vec(), size: 5 });
        assert_eq!(texts(&text), ["hello"]);
        let cut = download_result("/root/a", &Download { bytes: "é".as_bytes()[..1].to_vec(), size: 2 });
        assert_eq!(texts(&cut)[0], "");
        assert!(texts(&cut)[1].contains("only the first 1 of 2 bytes"));
        let png = download_result("/root/p.png", &Download { bytes: b"\x89PNG\r\n\x1a\nxyz".to_vec(), size: 11 });
        assert_eq!(png.content[1].as_image().map(|i| i.mime_type.as_str()), Some("image/png"));
        let bin = download_result("/root/b", &Download { bytes: vec![0xff, 0x00], size: 2 });
        assert!(texts(&bin)[0].ends_with("base64 of all of it:\n/wA="));
    }
}
