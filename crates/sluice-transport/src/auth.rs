//! The job's token and the hello that carries it: the first frame on every connection.
//!
//! Hello body: `b"SLPR1"`, `u8` protocol-name length, the protocol name, the token (the
//! rest). Answer: `u8` 0 (accepted) or 1 followed by a UTF-8 reason.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use crate::TransportError;

/// Where a learner finds the token when its spec has none.
pub const TOKEN_ENV: &str = "SLUICE_PEER_TOKEN";
/// Longest token accepted.
pub const MAX_TOKEN: usize = 4096;
/// Largest hello a server reads.
pub const MAX_HELLO: u32 = (MAGIC.len() + 1 + u8::MAX as usize + MAX_TOKEN) as u32;

const MAGIC: &[u8; 5] = b"SLPR1";
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

/// The job's shared secret. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from text: not empty, at most [`MAX_TOKEN`] bytes. `field` names where it
    /// came from, for the error.
    pub fn new(text: &str, field: &'static str) -> Result<Self, TransportError> {
        let problem = if text.is_empty() {
            "the token is empty".to_string()
        } else if text.len() > MAX_TOKEN {
            format!("the token has {} bytes (at most {MAX_TOKEN})", text.len())
        } else {
            return Ok(Self(Arc::from(text.as_bytes())));
        };
        Err(TransportError::BadToken { field, problem })
    }

    /// The spec's token if it has one, else [`TOKEN_ENV`]'s; neither is an error naming
    /// `field`: a peer server does not run unauthenticated.
    pub fn resolve(from_spec: Option<&str>, field: &'static str) -> Result<Self, TransportError> {
        match from_spec {
            Some(t) => Self::new(t, field),
            None => match std::env::var(TOKEN_ENV) {
                Ok(t) => Self::new(&t, TOKEN_ENV),
                Err(_) => Err(TransportError::NoToken { field }),
            },
        }
    }

    /// Whether `given` is this token, compared in constant time.
    pub fn matches(&self, given: &[u8]) -> bool {
        self.0.ct_eq(given).into()
    }
}

/// The hello a client opens a connection to a `protocol` server with.
pub fn hello(protocol: &str, token: &Token) -> Vec<u8> {
    let name = &protocol.as_bytes()[..protocol.len().min(u8::MAX as usize)];
    let mut body = Vec::with_capacity(MAGIC.len() + 1 + name.len() + token.0.len());
    body.extend_from_slice(MAGIC);
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(&token.0);
    body
}

/// Why a server turned a hello away (sent back to the client as the reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a sluice peer hello")]
    NotAHello,
    #[error("this server speaks {expected}, not {given}")]
    WrongProtocol { expected: String, given: String },
    #[error("wrong or missing token (the learners must share the job's token)")]
    WrongToken,
    #[error("{0} connections already; try again")]
    Busy(usize),
}

/// Checks a hello against the server's protocol and token.
pub fn check_hello(body: &[u8], protocol: &str, token: &Token) -> Result<(), Refusal> {
    let rest = body.strip_prefix(MAGIC.as_slice()).ok_or(Refusal::NotAHello)?;
    let (&n, rest) = rest.split_first().ok_or(Refusal::NotAHello)?;
    let name = rest.get(..n as usize).ok_or(Refusal::NotAHello)?;
    if name != protocol.as_bytes() {
        return Err(Refusal::WrongProtocol {
            expected: protocol.to_string(),
            given: String::from_utf8_lossy(name).into_owned(),
        });
    }
    if token.matches(&rest[n as usize..]) {
        Ok(())
    } else {
        Err(Refusal::WrongToken)
    }
}

/// The server's answer to a hello.
pub fn answer(verdict: &Result<(), Refusal>) -> Vec<u8> {
    match verdict {
        Ok(()) => vec![ACCEPTED],
        Err(r) => {
            let mut body = vec![REFUSED];
            body.extend_from_slice(r.to_string().as_bytes());
            body
        }
    }
}

/// Reads the server's answer: `Err` holds its reason for refusing.
pub fn read_answer(body: &[u8]) -> Result<(), String> {
    match body.split_first() {
        Some((&ACCEPTED, [])) => Ok(()),
        Some((&REFUSED, reason)) => Err(String::from_utf8_lossy(reason).into_owned()),
        _ => Err(format!("an answer of {} bytes that is not one", body.len())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_hello_passes_only_with_the_same_protocol_and_token() {
        let token = Token::new("s3cret", "test").unwrap();
        let other = Token::new("s3creT", "test").unwrap();
        assert_eq!(check_hello(&hello("p/1", &token), "p/1", &token), Ok(()));
        assert_eq!(check_hello(&hello("p/1", &other), "p/1", &token), Err(Refusal::WrongToken));
        assert!(matches!(check_hello(&hello("q/1", &token), "p/1", &token), Err(Refusal::WrongProtocol { .. })));
        assert_eq!(check_hello(b"SLPR1\x03p/1", "p/1", &token), Err(Refusal::WrongToken));
        assert_eq!(check_hello(b"SLPR1\x09p/1", "p/1", &token), Err(Refusal::NotAHello));
        assert_eq!(check_hello(b"GET / HTTP/1.1", "p/1", &token), Err(Refusal::NotAHello));
        assert_eq!(read_answer(&answer(&Ok(()))), Ok(()));
        assert_eq!(read_answer(&answer(&Err(Refusal::Busy(3)))), Err("3 connections already; try again".into()));
        assert!(Token::new("", "f").is_err() && Token::new(&"x".repeat(MAX_TOKEN + 1), "f").is_err());
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
    }
}
