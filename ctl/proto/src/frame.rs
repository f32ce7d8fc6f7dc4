//! Framing: `u32 LE length` of the rest, `u16 version`, `u16 kind`, body.
//!
//! The length covers version + kind + body and is at most [`MAX_FRAME`].
//! On the daemon's SOCK_SEQPACKET socket one datagram is exactly one frame;
//! [`frame_len`] serves byte-stream transports (ctl to ctl over TCP).

use crate::codec::Encoder;
use crate::{Msg, ProtoError, MAX_FRAME, PROTO_VERSION};

/// Size of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// Size of the whole header: length prefix, version, kind.
pub const HEADER_LEN: usize = LEN_PREFIX + 2 + 2;
/// Largest frame including its length prefix: the receive buffer size.
pub const MAX_FRAME_TOTAL: usize = LEN_PREFIX + MAX_FRAME;

/// Appends one complete frame carrying `msg` to `out`. On error `out` is
/// left as it was.
pub fn encode_into(msg: &Msg, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let start = out.len();
    let result = encode_at(msg, out, start);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_at(msg: &Msg, out: &mut Vec<u8>, start: usize) -> Result<(), ProtoError> {
    let mut e = Encoder::new(out);
    e.u32(0); // patched below once the body length is known
    e.u16(PROTO_VERSION);
    e.u16(msg.kind());
    msg.encode_body(&mut e)?;
    let len = out.len() - start - LEN_PREFIX;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge { len });
    }
    // `len <= MAX_FRAME` fits in u32.
    out[start..start + LEN_PREFIX].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// One complete frame carrying `msg`.
pub fn encode(msg: &Msg) -> Result<Vec<u8>, ProtoError> {
    let mut out = Vec::with_capacity(64);
    encode_into(msg, &mut out)?;
    Ok(out)
}

/// For byte streams: given the bytes received so far, the total size of the
/// first frame once its length prefix is complete (`None` before that).
/// An oversized or impossibly small length is an error right away, so a
/// reader never buffers more than one legal frame.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    let Some(prefix) = buf.get(..LEN_PREFIX) else {
        return Ok(None);
    };
    let mut p = [0u8; LEN_PREFIX];
    p.copy_from_slice(prefix);
    let len = u32::from_le_bytes(p) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge { len });
    }
    if len < HEADER_LEN - LEN_PREFIX {
        return Err(ProtoError::ShortFrame {
            len: len + LEN_PREFIX,
        });
    }
    Ok(Some(LEN_PREFIX + len))
}

/// Decodes exactly one frame; missing or extra bytes are errors.
pub fn decode(frame: &[u8]) -> Result<Msg, ProtoError> {
    if frame.len() < HEADER_LEN {
        return Err(ProtoError::ShortFrame { len: frame.len() });
    }
    let total = frame_len(frame)?.unwrap_or(HEADER_LEN);
    if total != frame.len() {
        return Err(ProtoError::LengthMismatch {
            declared: total - LEN_PREFIX,
            actual: frame.len() - LEN_PREFIX,
        });
    }
    let version = u16::from_le_bytes([frame[4], frame[5]]);
    if version != PROTO_VERSION {
        return Err(ProtoError::BadVersion { got: version });
    }
    let kind = u16::from_le_bytes([frame[6], frame[7]]);
    Msg::decode_body(kind, &frame[HEADER_LEN..])
}

/// Decodes one frame and checks the number of descriptors that came with it.
pub fn decode_with_fds(frame: &[u8], nfds: usize) -> Result<Msg, ProtoError> {
    let msg = decode(frame)?;
    msg.check_fds(nfds)?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let f = encode(&Msg::Ok).unwrap();
        assert_eq!(f, [4, 0, 0, 0, 1, 0, 0x02, 0x80]);
        assert_eq!(decode(&f).unwrap(), Msg::Ok);
    }

    #[test]
    fn short_frames() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                decode(&[0u8; 8][..n]),
                Err(ProtoError::ShortFrame { len: n })
            );
        }
        assert_eq!(frame_len(&[1, 0]), Ok(None));
        assert!(matches!(
            frame_len(&[3, 0, 0, 0]),
            Err(ProtoError::ShortFrame { .. })
        ));
    }

    #[test]
    fn oversized_length_prefix() {
        let mut f = encode(&Msg::Ok).unwrap();
        f[..4].copy_from_slice(&((MAX_FRAME + 1) as u32).to_le_bytes());
        assert_eq!(decode(&f), Err(ProtoError::TooLarge { len: MAX_FRAME + 1 }));
        f[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&f), Err(ProtoError::TooLarge { .. })));
    }

    #[test]
    fn trailing_and_truncated_frames() {
        let mut f = encode(&Msg::Collect { offer_id: 9 }).unwrap();
        f.push(0);
        assert!(matches!(decode(&f), Err(ProtoError::LengthMismatch { .. })));
        f.pop();
        f.pop();
        assert!(matches!(decode(&f), Err(ProtoError::LengthMismatch { .. })));
        // Consistent length prefix, but the body has an extra byte.
        let mut g = encode(&Msg::Collect { offer_id: 9 }).unwrap();
        g.push(0);
        let len = (g.len() - LEN_PREFIX) as u32;
        g[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(
            decode(&g),
            Err(ProtoError::Trailing {
                kind: "Collect",
                extra: 1
            })
        );
        // Consistent prefix, body too short.
        let mut h = encode(&Msg::Collect { offer_id: 9 }).unwrap();
        h.truncate(h.len() - 1);
        let len = (h.len() - LEN_PREFIX) as u32;
        h[..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(decode(&h), Err(ProtoError::Truncated { .. })));
    }

    #[test]
    fn wrong_version_and_unknown_kind() {
        let mut f = encode(&Msg::Ok).unwrap();
        f[4] = 2;
        assert_eq!(decode(&f), Err(ProtoError::BadVersion { got: 2 }));
        let mut g = encode(&Msg::Ok).unwrap();
        g[6..8].copy_from_slice(&0x7777u16.to_le_bytes());
        assert_eq!(decode(&g), Err(ProtoError::UnknownKind { kind: 0x7777 }));
    }

    #[test]
    fn fd_counts_are_checked() {
        let f = encode(&Msg::Claim).unwrap();
        assert!(decode_with_fds(&f, 1).is_ok());
        assert!(matches!(
            decode_with_fds(&f, 0),
            Err(ProtoError::FdCount { got: 0, .. })
        ));
        assert!(decode_with_fds(&encode(&Msg::Ok).unwrap(), 1).is_err());
    }

    #[test]
    fn encode_failure_leaves_buffer_intact() {
        let mut out = vec![1, 2, 3];
        let bad = Msg::Answered {
            payload: vec![0; crate::MAX_PAYLOAD + 1],
        };
        assert!(encode_into(&bad, &mut out).is_err());
        assert_eq!(out, [1, 2, 3]);
    }
}
