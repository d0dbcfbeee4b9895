//! Bytes a hostile rehearsal peer sends, read the way a learner's shard fetcher reads
//! them: a reply frame to a request for a few samples. Properties: nothing panics or
//! allocates past the frame cap; a reply that decodes has at most the samples asked for,
//! no more than the shard it reports, a sane shard length, non-empty images within the
//! image cap, and encodes back to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_transport::frame::read_frame;
use sluice_transport::messages::{self, rehearsal};

fuzz_target!(|data: &[u8]| {
    let Some((&asked, rest)) = data.split_first() else { return };
    let asked = u32::from(asked % 8);
    let max_image = 512;
    // As a server reads a request.
    if let Ok(req) = read_frame(&mut &rest[..], 4) {
        if let Ok(n) = messages::decode_u32(&req) {
            assert_eq!(messages::encode_u32(n).as_slice(), req.as_slice());
        }
    }
    // As a fetcher reads a reply: framed, then the body alone.
    let cap = rehearsal::max_reply(asked, max_image);
    let framed = read_frame(&mut &rest[..], cap);
    for body in [framed.ok(), Some(rest.to_vec())].into_iter().flatten() {
        assert!(body.len() <= cap as usize || body.len() == rest.len());
        let Ok((shard_len, samples)) = rehearsal::decode(&body, asked, max_image) else { continue };
        assert!(shard_len <= rehearsal::MAX_SHARD_LEN);
        assert!(samples.len() as u64 <= u64::from(asked) && samples.len() as u64 <= shard_len);
        assert!(samples.iter().all(|s| !s.image.is_empty() && s.image.len() as u64 <= max_image));
        let again = rehearsal::encode(shard_len, samples.iter().map(|s| (s.id, s.label, s.image.as_slice())));
        assert_eq!(again, body, "a reply that decodes encodes back to itself");
    }
});
