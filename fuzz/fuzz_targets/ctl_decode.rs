//! Fuzz target for the control protocol: arbitrary bytes go (1) to the
//! frame decoder, which must return (never panic) and, when it accepts,
//! must have read the one canonical encoding of the message; and (2) as a
//! script of session events (open, close, time, raw frames, well-formed
//! requests with fake descriptors) to the daemon's request handler, which
//! checks its invariants and descriptor accounting after every step.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = ringsock_proto::decode(data) {
        let again = ringsock_proto::encode(&msg).expect("a decoded message re-encodes");
        assert_eq!(again, data, "decoding accepted a non-canonical frame");
        assert_eq!(ringsock_proto::frame_len(data), Ok(Some(data.len())));
    }
    let _ = ringsock_ctl::fuzzing::run_script(data);
});
