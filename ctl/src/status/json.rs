//! `status --json`: `{"connections":[...]}`, one object per connection
//! end, fields in this order: `session`, `pid`, `uid`, `fd`, `exe`,
//! `name`, `local`, `peer`, `transport`, `reason`, `ring`; `name` is what
//! `ps` calls the process ("" when the daemon could not tell); `ring` is
//! null or `{"id": n|null, "stats": {name: value...}}` with the counters in
//! the daemon's order. Scripts and tests read these names: they do not
//! change. Listings saved before `name` existed read back without it.
//!
//! The same shape is read back (`status --from`): one listing per line,
//! as a sampler appends them to a file.

use std::net::SocketAddr;

use ringsock_proto::{RingStat, StatusEntry, Transport};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Deserializer, Serialize};

#[derive(Serialize, Deserialize)]
struct Listing {
    connections: Vec<Connection>,
}

#[derive(Serialize, Deserialize)]
struct Connection {
    session: u64,
    pid: u32,
    uid: u32,
    fd: i32,
    exe: String,
    #[serde(default)]
    name: String,
    local: SocketAddr,
    peer: SocketAddr,
    #[serde(with = "transport_name")]
    transport: Transport,
    reason: String,
    ring: Option<Ring>,
}

#[derive(Serialize, Deserialize)]
struct Ring {
    id: Option<u64>,
    #[serde(serialize_with = "stats_as_map", deserialize_with = "stats_from_map")]
    stats: Vec<RingStat>,
}

mod transport_name {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    use ringsock_proto::Transport;

    pub fn serialize<S: Serializer>(t: &Transport, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Transport, D::Error> {
        let name = String::deserialize(d)?;
        Transport::from_name(&name)
            .ok_or_else(|| D::Error::custom(format!("unknown transport {name:?}")))
    }
}

/// The counters as one JSON object, in the daemon's order (a provider's
/// order is meaningful to a reader of the raw text).
fn stats_as_map<S: Serializer>(stats: &[RingStat], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(stats.len()))?;
    for st in stats {
        m.serialize_entry(&st.name, &st.value)?;
    }
    m.end()
}

fn stats_from_map<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RingStat>, D::Error> {
    // A map visitor keeps the text's order; a BTreeMap would sort it.
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<RingStat>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of counter names and unsigned values")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((name, value)) = a.next_entry::<String, u64>()? {
                out.push(RingStat { name, value });
            }
            Ok(out)
        }
    }
    d.deserialize_map(Visitor)
}

impl From<&StatusEntry> for Connection {
    fn from(e: &StatusEntry) -> Self {
        Connection {
            session: e.session,
            pid: e.pid,
            uid: e.uid,
            fd: e.fd,
            exe: e.exe.clone(),
            name: e.name.clone(),
            local: e.local,
            peer: e.peer,
            transport: e.transport,
            reason: e.reason.clone(),
            ring: (e.ring.is_some() || !e.ring_stats.is_empty()).then(|| Ring {
                id: e.ring,
                stats: e.ring_stats.clone(),
            }),
        }
    }
}

impl From<Connection> for StatusEntry {
    fn from(c: Connection) -> Self {
        let (ring, ring_stats) = c.ring.map_or((None, Vec::new()), |r| (r.id, r.stats));
        StatusEntry {
            session: c.session,
            pid: c.pid,
            uid: c.uid,
            exe: c.exe,
            name: c.name,
            fd: c.fd,
            local: c.local,
            peer: c.peer,
            transport: c.transport,
            reason: c.reason,
            ring,
            ring_stats,
        }
    }
}

/// The listing as one line of JSON, newline-terminated.
pub fn render(entries: &[StatusEntry]) -> String {
    let listing = Listing {
        connections: entries.iter().map(Connection::from).collect(),
    };
    let mut out = serde_json::to_string(&listing).expect("a listing always serializes");
    out.push('\n');
    out
}

/// One listing, as `render` writes it.
pub fn parse(text: &str) -> Result<Vec<StatusEntry>, serde_json::Error> {
    let listing: Listing = serde_json::from_str(text)?;
    Ok(listing
        .connections
        .into_iter()
        .map(StatusEntry::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::entry;

    #[test]
    fn shape() {
        assert_eq!(
            render(&[entry()]),
            "{\"connections\":[{\"session\":16,\"pid\":42,\"uid\":0,\"fd\":7,\
             \"exe\":\"/usr/bin/redis-\\\"server\",\"name\":\"redis-server\",\
             \"local\":\"127.0.0.1:6379\",\
             \"peer\":\"[::1]:5000\",\"transport\":\"shm\",\"reason\":\"line\\nbreak\",\
             \"ring\":{\"id\":3,\"stats\":{\"memfd_size\":4096}}}]}\n"
        );
        assert_eq!(render(&[]), "{\"connections\":[]}\n");
        let mut e = entry();
        e.ring = None;
        e.ring_stats.clear();
        assert!(render(&[e]).contains("\"ring\":null"));
    }

    #[test]
    fn every_counter_in_order_and_back() {
        let mut e = entry();
        e.transport = Transport::Rdma;
        e.ring = None;
        e.ring_stats = ["zc_writes", "out_bytes", "a\u{1}b"]
            .iter()
            .enumerate()
            .map(|(i, n)| RingStat {
                name: (*n).into(),
                value: if i == 1 { u64::MAX } else { 0 },
            })
            .collect();
        let text = render(std::slice::from_ref(&e));
        assert!(
            text.contains(&format!(
                "\"stats\":{{\"zc_writes\":0,\"out_bytes\":{},\"a\\u0001b\":0}}",
                u64::MAX
            )),
            "{text}"
        );
        assert!(text.contains("\"ring\":{\"id\":null,"), "{text}");
        assert_eq!(parse(&text).unwrap(), vec![e]);
    }

    #[test]
    fn refuses_what_it_would_not_write() {
        for bad in [
            "{}",
            "{\"connections\":[{\"session\":1}]}",
            "{\"connections\":[]} x",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let good = render(&[entry()]);
        // A line saved before names were listed.
        let old = good.replace("\"name\":\"redis-server\",", "");
        assert_eq!(parse(&old).unwrap()[0].name, "");
        let other = good.replace("\"shm\"", "\"carrier-pigeon\"");
        assert!(parse(&other)
            .unwrap_err()
            .to_string()
            .contains("carrier-pigeon"));
    }
}
