//! ringsock.7 from docs/shim.md: the "## Knobs" section's paragraphs and
//! tables (`| variable | default | meaning |`) become the ENVIRONMENT
//! section, one tagged paragraph per variable. Only what that section
//! uses is understood (paragraphs, tables, `code`, [links](..)); anything
//! else is an error, so a change to the section cannot drop text silently.

use roff::{bold, roman, Inline, Roff};

const SECTION: &str = "## Knobs";

/// The whole page.
pub fn page(markdown: &str, date: &str, source: &str, manual: &str) -> Result<String, String> {
    let blocks = blocks(section(markdown)?)?;
    let mut r = Roff::new();
    r.control("TH", ["ringsock", "7", date, source, manual]);
    r.control("SH", ["NAME"]);
    r.text([roman(
        "ringsock - kernel-bypass rings under unmodified TCP programs",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        bold("LD_PRELOAD=/usr/lib/ringsock/libringsock.so"),
        roman(" "),
        Inline::Italic("program".into()),
    ]);
    r.control("br", []);
    r.text([
        bold("ringsock-ctl run"),
        roman(" "),
        Inline::Italic("program".into()),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman(
        "libringsock.so, preloaded into a program, moves its TCP connections onto \
         ring buffers: shared memory between processes of one host, RDMA verbs rings \
         between hosts. The ringsock-ctl daemon of each host sets the rings up; the \
         kernel TCP connection stays underneath, and whatever the shim cannot carry \
         stays plain TCP.",
    )]);
    r.control("SH", ["ENVIRONMENT"]);
    for b in &blocks {
        match b {
            Block::Para(text) => {
                r.control("PP", []);
                r.text(inlines(text)?);
            }
            Block::Row(var, default, meaning) => {
                let mut tag = inlines(var)?;
                tag.push(roman(" (default: "));
                tag.extend(inlines(default)?);
                tag.push(roman(")"));
                r.control("TP", []);
                r.text(tag);
                r.text(inlines(meaning)?);
            }
        }
    }
    r.control("SH", ["FILES"]);
    r.control("TP", []);
    r.text([bold("/usr/lib/ringsock/libringsock.so")]);
    r.text([roman("The shim.")]);
    r.control("TP", []);
    r.text([bold("/run/ringsock/ctl.sock")]);
    r.text([roman(
        "The daemon's control socket (RINGSOCK_CTL_SOCK's default).",
    )]);
    r.control("SH", ["SEE ALSO"]);
    r.text([
        bold("ringsock-ctl"),
        roman("(8), "),
        bold("ld.so"),
        roman("(8)"),
    ]);
    Ok(r.render())
}

/// The lines of the Knobs section, up to the next `## ` heading.
fn section(markdown: &str) -> Result<Vec<&str>, String> {
    let mut lines = markdown.lines();
    lines
        .by_ref()
        .find(|l| l.trim_end() == SECTION)
        .ok_or_else(|| format!("docs/shim.md has no {SECTION:?} section"))?;
    Ok(lines.take_while(|l| !l.starts_with("## ")).collect())
}

#[derive(Debug, PartialEq)]
enum Block {
    /// A paragraph, its lines joined by spaces.
    Para(String),
    /// A table row: variable, default, meaning (markdown inline text).
    Row(String, String, String),
}

fn blocks(lines: Vec<&str>) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut para: Vec<&str> = Vec::new();
    let flush = |para: &mut Vec<&str>, out: &mut Vec<Block>| {
        if !para.is_empty() {
            out.push(Block::Para(para.join(" ")));
            para.clear();
        }
    };
    for line in lines {
        let l = line.trim();
        if l.is_empty() {
            flush(&mut para, &mut out);
        } else if let Some(inner) = l.strip_prefix('|') {
            flush(&mut para, &mut out);
            let cells: Vec<&str> = inner
                .strip_suffix('|')
                .ok_or_else(|| format!("table row without a closing |: {l}"))?
                .split('|')
                .map(str::trim)
                .collect();
            let [var, default, meaning] = cells[..] else {
                return Err(format!("table row without 3 cells: {l}"));
            };
            let separator = cells
                .iter()
                .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'));
            if separator || var == "variable" {
                continue;
            }
            out.push(Block::Row(var.into(), default.into(), meaning.into()));
        } else if l.starts_with('#') || l.starts_with("```") || l.starts_with("- ") {
            return Err(format!("unsupported markdown in {SECTION}: {l}"));
        } else {
            para.push(l);
        }
    }
    flush(&mut para, &mut out);
    if !out.iter().any(|b| matches!(b, Block::Row(..))) {
        return Err(format!("{SECTION} of docs/shim.md lists no variable"));
    }
    Ok(out)
}

/// `code` becomes bold, [text](target) its text; the rest is roman.
fn inlines(md: &str) -> Result<Vec<Inline>, String> {
    let mut out = Vec::new();
    let mut plain = String::new();
    let mut rest = md;
    while let Some(i) = rest.find(['`', '[']) {
        plain.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(code) = tail.strip_prefix('`') {
            let end = code
                .find('`')
                .ok_or_else(|| format!("unclosed ` in: {md}"))?;
            out.push(roman(std::mem::take(&mut plain)));
            out.push(bold(&code[..end]));
            rest = &code[end + 1..];
        } else {
            let (text, after) = link(tail).ok_or_else(|| format!("unsupported [ in: {md}"))?;
            plain.push_str(text);
            rest = after;
        }
    }
    plain.push_str(rest);
    out.push(roman(plain));
    out.retain(|i| !matches!(i, Inline::Roman(s) if s.is_empty()));
    Ok(out)
}

/// `[text](target)rest` -> (text, rest).
fn link(s: &str) -> Option<(&str, &str)> {
    let close = s.find("](")?;
    let end = close + s[close..].find(')')?;
    Some((&s[1..close], &s[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD: &str = "# x\n\n## Knobs\n\nEvery knob is read\nonce (`a/b`).\n\n\
| variable | default | meaning |\n|---|---|---|\n\
| `RINGSOCK_A` | `0` | see [limits.md](limits.md) now |\n\nTail.\n\n## Next\n\n| `NOT_ME` | x | y |\n";

    #[test]
    fn knobs_section_becomes_paragraphs_and_rows() {
        let b = blocks(section(MD).unwrap()).unwrap();
        assert_eq!(
            b,
            vec![
                Block::Para("Every knob is read once (`a/b`).".into()),
                Block::Row(
                    "`RINGSOCK_A`".into(),
                    "`0`".into(),
                    "see [limits.md](limits.md) now".into()
                ),
                Block::Para("Tail.".into()),
            ]
        );
    }

    #[test]
    fn inline_code_is_bold_and_links_keep_their_text() {
        assert_eq!(
            inlines("see [limits.md](limits.md) and `X_Y`, ok").unwrap(),
            vec![roman("see limits.md and "), bold("X_Y"), roman(", ok")]
        );
        assert!(inlines("open `tick").is_err());
    }

    #[test]
    fn unknown_markdown_and_bad_rows_are_errors() {
        assert!(blocks(vec!["### Sub"]).is_err());
        assert!(blocks(vec!["| a | b |"]).is_err());
        assert!(blocks(vec!["just text"]).is_err());
    }

    #[test]
    fn the_real_page_names_every_knob_of_the_docs() {
        let page = page(crate::SHIM_MD, "2026-01-01", "ringsock 0", "ringsock").unwrap();
        for v in [
            "RINGSOCK_DISABLE",
            "RINGSOCK_ZEROCOPY_MIN",
            "RINGSOCK_DEVICE",
            "RINGSOCK_LIB",
        ] {
            assert!(page.contains(v), "{v} missing from ringsock.7");
        }
        assert!(
            page.contains(".TH ringsock 7 2026-01-01 \"ringsock 0\" ringsock\n"),
            "{page}"
        );
    }
}
