//! Bytes a hostile client or peer sends, read the way the locality peer transport reads
//! them: as a server (a hello, then request frames) and as a client (a locality reply).
//! Properties: nothing panics or allocates past a cap; a refused hello is refused for a
//! reason; a request is a `u32`; a reply that decodes is within the receiver's limits
//! and encodes back to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::{Image, Limits};
use sluice_transport::auth::{self, MAX_HELLO};
use sluice_transport::frame::read_frame;
use sluice_transport::messages::{self, locality};
use sluice_transport::Token;

const PROTOCOL: &str = locality::PROTOCOL;

fuzz_target!(|data: &[u8]| {
    let token = Token::new("fuzz-token", "fuzz").expect("a valid token");
    // As a server: the hello, then requests of at most 4 bytes.
    let mut wire = data;
    if let Ok(hello) = read_frame(&mut wire, MAX_HELLO) {
        assert!(hello.len() <= MAX_HELLO as usize);
        let verdict = auth::check_hello(&hello, PROTOCOL, &token);
        if verdict.is_ok() {
            assert!(hello.ends_with(b"fuzz-token"));
        }
        let answer = auth::answer(&verdict);
        assert_eq!(auth::read_answer(&answer).is_ok(), verdict.is_ok());
        while let Ok(req) = read_frame(&mut wire, 4) {
            if let Ok(pos) = messages::decode_u32(&req) {
                assert_eq!(messages::encode_u32(pos).as_slice(), req.as_slice());
            }
        }
    }
    // As a client: the whole input is a reply body, under small and default limits.
    for limits in [Limits { max_pixels: 64, max_file_bytes: 256, ..Limits::default() }, Limits::default()] {
        let Ok(received) = locality::decode(data, &limits) else { continue };
        let check = |img: &Image| {
            let pixels = u64::from(img.width) * u64::from(img.height);
            assert!(pixels > 0 && pixels <= limits.max_pixels);
            assert_eq!(img.as_bytes().len() as u64, pixels * Image::CHANNELS as u64);
        };
        let again = match &received {
            locality::Received::None => locality::encode(locality::Reply::None),
            locality::Received::Raw(b) => {
                assert!(b.len() as u64 <= limits.max_file_bytes);
                locality::encode(locality::Reply::Raw(b))
            }
            locality::Received::Decoded(img) => {
                check(img);
                locality::encode(locality::Reply::Decoded(img))
            }
            locality::Received::Resized(img) => {
                check(img);
                locality::encode(locality::Reply::Resized(img))
            }
        };
        assert_eq!(again, data, "a reply that decodes encodes back to itself");
    }
});
