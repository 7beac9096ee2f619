//! From a byte offset in the TOML source to a 1-based line and a dotted key path
//! (`table.subtable.key`), so every configuration error names where it is.
//!
//! The key is read from the source text around the offset: the nearest table header above it
//! (`[x]` / `[[x.y]]`) and the key on the offending line. Good enough for the files people write
//! (one key per line); an inline table yields its outer key.

/// 1-based line of `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Line and key path of the error spanning `span`; `message` (a toml error) may name a
/// missing field, which is appended to the path: to the table's, or alone when the span is
/// the whole document (a missing top-level table, whatever header line 1 holds).
pub(crate) fn line_and_key(
    text: &str,
    span: std::ops::Range<usize>,
    message: &str,
) -> (usize, String) {
    let line = line_of(text, span.start);
    let mut key = key_at(text, line);
    if let Some(field) = backquoted_after(message, "missing field") {
        // toml gives the document's own errors the span 0..0 (a table opening the file spans
        // its header and keys).
        let whole_document = span == (0..0);
        key = if whole_document {
            field.to_owned()
        } else {
            join(&key, field)
        };
    }
    (line, key)
}

/// The dotted key path of line `line` (1-based).
pub(crate) fn key_at(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(this) = lines.get(line.saturating_sub(1)) else {
        return String::new();
    };
    if let Some(h) = header(this) {
        return h.to_owned();
    }
    let table = lines[..line - 1]
        .iter()
        .rev()
        .find_map(|l| header(l))
        .unwrap_or("");
    let local = this
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_owned())
        .unwrap_or_default();
    if local.is_empty() {
        // A value continued from an earlier line (a multi-line array): use that line's key.
        let earlier = lines[..line - 1]
            .iter()
            .rev()
            .take_while(|l| header(l).is_none())
            .find_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()));
        return join(table, earlier.as_deref().unwrap_or(""));
    }
    join(table, &local)
}

fn header(line: &str) -> Option<&str> {
    let t = line.trim();
    let inner = t
        .strip_prefix("[[")
        .and_then(|t| t.split_once("]]"))
        .map(|(h, _)| h);
    let inner = inner.or_else(|| {
        t.strip_prefix('[')
            .and_then(|t| t.split_once(']'))
            .map(|(h, _)| h)
    });
    inner.map(str::trim)
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a}.{b}"),
    }
}

fn backquoted_after<'a>(message: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &message[message.find(marker)? + marker.len()..];
    let start = rest.find('`')? + 1;
    let len = rest[start..].find('`')?;
    Some(&rest[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_lines() {
        let text = "[transport]\nlisten = [\n  \"x\",\n]\n\n[[subsystem]]\nnqn = \"a\"\n[[subsystem.namespace]]\n bdev = \"b\"\n";
        assert_eq!(key_at(text, 1), "transport");
        assert_eq!(key_at(text, 3), "transport.listen");
        assert_eq!(key_at(text, 7), "subsystem.nqn");
        assert_eq!(key_at(text, 9), "subsystem.namespace.bdev");
        assert_eq!(line_of(text, text.find("bdev").unwrap()), 9);
        // A field missing from the table the error spans, and one missing from the whole
        // document (a top-level table: not the table whose header happens to open the file).
        let transport = 0..text.find("[[subsystem]]").unwrap();
        assert_eq!(
            line_and_key(text, transport, "missing field `cores`"),
            (1, "transport.cores".to_owned())
        );
        assert_eq!(
            line_and_key(text, 0..0, "missing field `reactors`"),
            (1, "reactors".to_owned())
        );
        // A table that opens the file and runs to its end is still that table.
        let only = "[reactors]\nbusy_poll = true\n";
        assert_eq!(
            line_and_key(only, 0..only.len(), "missing field `cores`"),
            (1, "reactors.cores".to_owned())
        );
    }
}
