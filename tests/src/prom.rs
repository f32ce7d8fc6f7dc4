//! A strict reader of the Prometheus text exposition format (0.0.4) as
//! `ringsock-ctl metrics` writes it: every sample's family declared by
//! `# HELP` and `# TYPE` first, counter names ending in `_total`,
//! histogram buckets cumulative and ending in `+Inf` equal to `_count`.

use std::collections::BTreeMap;

/// Samples by `name{label="value",...}` (labels as written, sorted by
/// name), and each family's type.
#[derive(Debug, Default)]
pub struct Exposition {
    pub samples: BTreeMap<String, f64>,
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    /// The value of `key` (`name` or `name{l="v"}`), panicking if absent.
    pub fn get(&self, key: &str) -> f64 {
        *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("no sample {key}; have {:?}", self.samples.keys()))
    }
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Parses `{a="x",b="y"}` (escapes \\ \" \n) into sorted pairs; returns
/// the rest of the line.
type Labels = Vec<(String, String)>;

fn labels(s: &str) -> Result<(Labels, &str), String> {
    let mut out = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("no {")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            out.sort();
            return Ok((out, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !valid_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("unquoted label")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.push((name.to_owned(), value));
        rest = &rest[eq + 2 + end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn key(name: &str, labels: &[(String, String)]) -> String {
    if labels.is_empty() {
        return name.to_owned();
    }
    let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", l.join(","))
}

/// The family a sample belongs to (histogram series share their base).
fn family<'a>(name: &'a str, types: &BTreeMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base).is_some_and(|t| t == "histogram") {
                return base;
            }
        }
    }
    name
}

pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    let mut helped = std::collections::BTreeSet::new();
    if !text.ends_with('\n') {
        return Err("text does not end with a line feed".into());
    }
    for (n, line) in text.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name) || !helped.insert(name.to_owned()) {
                return Err(err("bad or repeated HELP".into()));
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| err("TYPE".into()))?;
            if !helped.contains(name) {
                return Err(err("TYPE before HELP".into()));
            }
            if !["counter", "gauge", "histogram"].contains(&kind) {
                return Err(err(format!("type {kind}")));
            }
            if (kind == "counter") != name.ends_with("_total") {
                return Err(err("counters (only) end in _total".into()));
            }
            if e.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                return Err(err("repeated TYPE".into()));
            }
        } else if line.starts_with('#') || line.is_empty() {
            return Err(err("unexpected line".into()));
        } else {
            let end = line
                .find(['{', ' '])
                .ok_or_else(|| err("no value".into()))?;
            let name = &line[..end];
            if !valid_name(name) {
                return Err(err("bad metric name".into()));
            }
            let (ls, rest) = if line[end..].starts_with('{') {
                labels(&line[end..]).map_err(err)?
            } else {
                (Vec::new(), &line[end..])
            };
            let v = rest
                .strip_prefix(' ')
                .ok_or_else(|| err("no space".into()))?;
            let value: f64 = match v {
                "+Inf" => f64::INFINITY,
                v => v.parse().map_err(|_| err(format!("value {v:?}")))?,
            };
            if !e.types.contains_key(family(name, &e.types)) {
                return Err(err("sample before its TYPE".into()));
            }
            if e.samples.insert(key(name, &ls), value).is_some() {
                return Err(err("repeated sample".into()));
            }
        }
    }
    for (name, kind) in &e.types {
        if kind != "histogram" {
            continue;
        }
        let prefix = format!("{name}_bucket{{le=\"");
        let mut buckets: Vec<(f64, f64)> = e
            .samples
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *v))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if buckets.last().map(|b| b.0) != Some(f64::INFINITY) {
            return Err(format!("{name}: no +Inf bucket"));
        }
        if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
            return Err(format!("{name}: buckets not cumulative"));
        }
        let count = e.samples.get(&format!("{name}_count"));
        if count != buckets.last().map(|b| &b.1) || !e.samples.contains_key(&format!("{name}_sum"))
        {
            return Err(format!(
                "{name}: _count/_sum missing or not the +Inf bucket"
            ));
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_should_and_refuses_the_rest() {
        let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"q\\\"\",b=\"1\"} 3\n\
                  # HELP h H.\n# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
        let e = parse(ok).unwrap();
        assert_eq!(e.get("a_total{b=\"1\",x=\"q\"\"}"), 3.0);
        assert_eq!(e.get("h_count"), 2.0);
        for bad in [
            "a 1\n",
            "# HELP a A.\n# TYPE a counter\na 1\n",
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0\nh_count 3\n",
            "# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n",
            "# HELP a A.\n# TYPE a gauge\na 1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
