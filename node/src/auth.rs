//! Bearer tokens for the public gRPC API: the tokens a node accepts (`--api-token-file`, one a
//! line) and the interceptor that refuses a call without one of them (`UNAUTHENTICATED`, with
//! the reason `TokenMissing` or `TokenRefused`).
//!
//! Tokens are kept as their SHA-256 digests and compared in time that does not depend on where
//! a presented token first differs, so a caller learns nothing from how fast it is refused.
//! This module reads the token file once, at start; it never logs a token.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use thiserror::Error;
use tonic::service::Interceptor;
use tonic::{Request, Status};
use tracing::debug;

use crate::status;

/// The metadata key a client puts its token in, as `Bearer <token>` (RFC 6750).
pub const AUTHORIZATION_KEY: &str = "authorization";
/// Shortest token accepted: a guessable token would be no protection.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Longest token accepted (a header value of reasonable size).
pub const TOKEN_BYTES_MAX: usize = 512;
/// Tokens one file may hold (several let an operator rotate: add the new one, move the
/// clients, remove the old one).
pub const TOKENS_MAX: usize = 64;

/// Why the token file is unusable. The node does not start.
#[derive(Debug, Error)]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("cannot read the API token file {path}: {reason}")]
    Unreadable { path: String, reason: String },
    /// The file holds no token.
    #[error(
        "the API token file {path} holds no token (one per line; blank lines and lines \
         starting with # are skipped)"
    )]
    Empty { path: String },
    /// A line is not a usable token.
    #[error("the API token file {path}, line {line}: {reason}")]
    Malformed {
        path: String,
        line: usize,
        reason: String,
    },
    /// More tokens than a file may hold.
    #[error("the API token file {path} holds more than {TOKENS_MAX} tokens")]
    TooMany { path: String },
}

/// The tokens a node accepts.
pub struct ApiTokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTokens")
            .field("tokens", &self.digests.len())
            .finish()
    }
}

impl ApiTokens {
    /// Reads the tokens in `path`: one a line, surrounding whitespace trimmed, blank lines and
    /// lines starting with `#` skipped; each `TOKEN_BYTES_MIN` to `TOKEN_BYTES_MAX` visible
    /// ASCII characters (what an HTTP header carries unchanged).
    ///
    /// # Errors
    /// [`TokenFileError`] naming the file (and the line) at fault; never the token itself.
    pub fn load(path: &Path) -> Result<ApiTokens, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| TokenFileError::Unreadable {
            path: path.display().to_string(),
            reason: error.to_string(),
        })?;
        let mut digests = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() || token.starts_with('#') {
                continue;
            }
            let malformed = |reason: String| TokenFileError::Malformed {
                path: path.display().to_string(),
                line: index + 1,
                reason,
            };
            if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&token.len()) {
                return Err(malformed(format!(
                    "a token has {TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX} characters, this one {}",
                    token.len()
                )));
            }
            if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
                return Err(malformed(
                    "a token is visible ASCII characters only (no spaces)".to_owned(),
                ));
            }
            if digests.len() == TOKENS_MAX {
                return Err(TokenFileError::TooMany {
                    path: path.display().to_string(),
                });
            }
            digests.push(digest(token.as_bytes()));
        }
        if digests.is_empty() {
            return Err(TokenFileError::Empty {
                path: path.display().to_string(),
            });
        }
        Ok(ApiTokens { digests })
    }

    /// How many tokens are accepted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Always `false`: a token file holds at least one token.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `presented` is one of the tokens. Every stored digest is compared in full.
    fn accepts(&self, presented: &[u8]) -> bool {
        let presented = digest(presented);
        self.digests.iter().fold(false, |found, stored| {
            let differences = stored
                .iter()
                .zip(presented.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            found | (differences == 0)
        })
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The gRPC API's interceptor: with tokens, a call passes only with `authorization: Bearer
/// <token>` naming one of them; without (`None`), every call passes.
#[derive(Clone, Debug)]
pub struct ApiAuth {
    tokens: Option<Arc<ApiTokens>>,
}

impl ApiAuth {
    /// An interceptor accepting `tokens`, or everyone for `None`.
    #[must_use]
    pub fn new(tokens: Option<ApiTokens>) -> ApiAuth {
        ApiAuth {
            tokens: tokens.map(Arc::new),
        }
    }
}

impl Interceptor for ApiAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(request);
        };
        let remote = request.remote_addr();
        let Some(value) = request.metadata().get(AUTHORIZATION_KEY) else {
            debug!(peer = ?remote, "refused a call without a bearer token");
            return Err(status::token_missing(
                "this node requires a bearer token: send the metadata `authorization: Bearer \
                 <token>` (the CLI's --token or TRIREME_TOKEN)",
            ));
        };
        let token = value.as_bytes().strip_prefix(b"Bearer ").or_else(|| {
            // The scheme is case-insensitive (RFC 7235).
            let bytes = value.as_bytes();
            (bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ")).then(|| &bytes[7..])
        });
        let Some(token) = token else {
            debug!(peer = ?remote, "refused a call whose authorization is not a bearer token");
            return Err(status::token_missing(
                "the authorization metadata must be `Bearer <token>`",
            ));
        };
        if tokens.accepts(token) {
            Ok(request)
        } else {
            debug!(peer = ?remote, "refused a call with a token this node does not accept");
            Err(status::token_refused(
                "the bearer token is not one this node accepts",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tonic::Code;
    use tonic::metadata::MetadataValue;

    use super::*;

    const TOKEN: &str = "a-token-of-32-characters-exactly";

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file
    }

    fn call(auth: &mut ApiAuth, authorization: Option<&str>) -> Result<(), Status> {
        let mut request = Request::new(());
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_KEY, MetadataValue::try_from(value).unwrap());
        }
        auth.call(request).map(|_| ())
    }

    fn reason(status: &Status) -> &str {
        status
            .metadata()
            .get(status::REASON_KEY)
            .unwrap()
            .to_str()
            .unwrap()
    }

    #[test]
    fn a_token_file_holds_one_token_a_line_with_comments_and_blank_lines() {
        let tokens = ApiTokens::load(
            file(&format!(
                "# rotated 2026-12\n\n  {TOKEN}  \nanother-token-0123456789\n"
            ))
            .path(),
        )
        .unwrap();
        assert_eq!(tokens.len(), 2);
        assert!(tokens.accepts(TOKEN.as_bytes()));
        assert!(tokens.accepts(b"another-token-0123456789"));
        assert!(!tokens.accepts(b"a-token-of-32-characters-exactlY"));
        assert!(!tokens.accepts(b""));
    }

    #[test]
    fn an_unusable_token_file_is_refused_with_its_line_and_never_its_token() {
        let short = "short-token";
        for (text, expected_line) in [
            (format!("{TOKEN}\n{short}\n"), Some(2)),
            ("has a space in it, so no token\n".to_owned(), Some(1)),
            (format!("{}\n", "x".repeat(TOKEN_BYTES_MAX + 1)), Some(1)),
            ("# only a comment\n\n".to_owned(), None),
        ] {
            let error = ApiTokens::load(file(&text).path()).unwrap_err();
            match expected_line {
                Some(expected) => assert!(
                    matches!(error, TokenFileError::Malformed { line, .. } if line == expected),
                    "{text:?}: {error}"
                ),
                None => assert!(matches!(error, TokenFileError::Empty { .. }), "{error}"),
            }
            assert!(!error.to_string().contains(short), "{error}");
        }
        let many: String = (0..=TOKENS_MAX)
            .map(|index| format!("token-number-{index:08}\n"))
            .collect();
        assert!(matches!(
            ApiTokens::load(file(&many).path()).unwrap_err(),
            TokenFileError::TooMany { .. }
        ));
        assert!(matches!(
            ApiTokens::load(Path::new("/nonexistent/tokens")).unwrap_err(),
            TokenFileError::Unreadable { .. }
        ));
    }

    #[test]
    fn the_interceptor_lets_through_only_a_bearer_of_an_accepted_token() {
        let mut auth = ApiAuth::new(Some(ApiTokens::load(file(TOKEN).path()).unwrap()));
        assert!(call(&mut auth, Some(&format!("Bearer {TOKEN}"))).is_ok());
        assert!(call(&mut auth, Some(&format!("bearer {TOKEN}"))).is_ok());
        let missing = call(&mut auth, None).unwrap_err();
        assert_eq!(missing.code(), Code::Unauthenticated);
        assert_eq!(reason(&missing), "TokenMissing");
        assert!(missing.message().contains("--token"), "{missing:?}");
        let not_bearer = call(&mut auth, Some(&format!("Basic {TOKEN}"))).unwrap_err();
        assert_eq!(reason(&not_bearer), "TokenMissing");
        let refused = call(&mut auth, Some("Bearer another-token-0123456789")).unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
        assert_eq!(reason(&refused), "TokenRefused");
        // Without tokens everything passes, a token or not.
        let mut open = ApiAuth::new(None);
        assert!(call(&mut open, None).is_ok());
        assert!(call(&mut open, Some("Bearer anything")).is_ok());
    }
}
