//! Bearer tokens for the public gRPC API: the tokens a node accepts (`--api-token-file`, one a
//! line) and the service layer that refuses a call without one of them (`UNAUTHENTICATED`, with
//! the reason `TokenMissing` or `TokenRefused`).
//!
//! Tokens are kept as their SHA-256 digests and compared in time that does not depend on where
//! a presented token first differs, so a caller learns nothing from how fast it is refused.
//! This module reads the token file once, at start; it never logs a token.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http;
use sha2::{Digest, Sha256};
use thiserror::Error;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
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

/// The gRPC API's check: with tokens, a call passes only with `authorization: Bearer <token>`
/// naming one of them; without (`None`), every call passes.
#[derive(Clone, Debug)]
pub struct ApiAuth {
    tokens: Option<Arc<ApiTokens>>,
}

impl ApiAuth {
    /// A check accepting `tokens`, or everyone for `None`.
    #[must_use]
    pub fn new(tokens: Option<ApiTokens>) -> ApiAuth {
        ApiAuth {
            tokens: tokens.map(Arc::new),
        }
    }

    /// Whether `request` may pass.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` with the reason `TokenMissing` (no `authorization`, or not a bearer
    /// token) or `TokenRefused` (a token this node does not accept).
    pub fn check<B>(&self, request: &http::Request<B>) -> Result<(), Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(());
        };
        let Some(value) = request.headers().get(AUTHORIZATION_KEY) else {
            debug!(peer = ?remote_addr(request), "refused a call without a bearer token");
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
            debug!(peer = ?remote_addr(request), "refused a call whose authorization is not a bearer token");
            return Err(status::token_missing(
                "the authorization metadata must be `Bearer <token>`",
            ));
        };
        if tokens.accepts(token) {
            Ok(())
        } else {
            debug!(peer = ?remote_addr(request), "refused a call with a token this node does not accept");
            Err(status::token_refused(
                "the bearer token is not one this node accepts",
            ))
        }
    }
}

/// The client's address, as tonic's server records it in a request's extensions (for the log).
fn remote_addr<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    let extensions = request.extensions();
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
        })
}

/// The gRPC service `inner` behind an [`ApiAuth`]: a call that does not pass is answered with
/// its refusal (a trailers-only response) and never reaches `inner`.
///
/// It reads the `authorization` header where it is. tonic's interceptor, which this replaces,
/// turned every request's headers into metadata and back to hand it the call, tokens or none,
/// and wrapped every response body (BENCHMARKS.md 6r).
#[derive(Clone, Debug)]
pub struct Authenticated<S> {
    inner: S,
    auth: ApiAuth,
}

impl<S> Authenticated<S> {
    /// `inner`, answering only the calls `auth` lets pass.
    #[must_use]
    pub fn new(inner: S, auth: ApiAuth) -> Authenticated<S> {
        Authenticated { inner, auth }
    }
}

impl<S, B> tower::Service<http::Request<B>> for Authenticated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    // Polled in place: tonic's generated server boxes its own future, which is `Unpin`.
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = AuthFuture<S::Future>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<B>) -> AuthFuture<S::Future> {
        match self.auth.check(&request) {
            Ok(()) => AuthFuture::Passed(self.inner.call(request)),
            Err(refusal) => AuthFuture::Refused(Some(refusal.into_http())),
        }
    }
}

/// The answer of an [`Authenticated`] service: the inner service's, or the refusal.
#[derive(Debug)]
pub enum AuthFuture<F> {
    /// The call passed: the inner service's answer.
    Passed(F),
    /// The call was refused: its answer, until it is taken.
    Refused(Option<http::Response<Body>>),
}

impl<F, E> Future for AuthFuture<F>
where
    F: Future<Output = Result<http::Response<Body>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        match self.get_mut() {
            AuthFuture::Passed(answer) => Pin::new(answer).poll(context),
            AuthFuture::Refused(refusal) => Poll::Ready(Ok(refusal
                .take()
                .expect("a refusal is not polled after it was ready"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tonic::Code;

    use super::*;

    const TOKEN: &str = "a-token-of-32-characters-exactly";

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file
    }

    fn call(auth: &ApiAuth, authorization: Option<&str>) -> Result<(), Status> {
        let mut request = http::Request::new(());
        if let Some(value) = authorization {
            request
                .headers_mut()
                .insert(AUTHORIZATION_KEY, value.parse().unwrap());
        }
        auth.check(&request)
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

    /// The layer as the server runs it: a refused call is answered trailers-only with its
    /// status and reason, and never reaches the service; a call that passes reaches it as sent.
    #[tokio::test]
    async fn the_layer_answers_a_refusal_itself_and_passes_the_rest_unchanged() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use tower::ServiceExt;

        let served = Arc::new(AtomicUsize::new(0));
        let service = |auth: ApiAuth| {
            let served = Arc::clone(&served);
            Authenticated::new(
                tower::service_fn(move |request: http::Request<()>| {
                    served.fetch_add(1, Ordering::SeqCst);
                    let echoed = request.headers().get(AUTHORIZATION_KEY).cloned();
                    // Boxed, as tonic's generated server's answer is.
                    Box::pin(async move {
                        let mut response = http::Response::new(Body::default());
                        if let Some(value) = echoed {
                            response.headers_mut().insert(AUTHORIZATION_KEY, value);
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    }) as std::pin::Pin<Box<dyn Future<Output = _> + Send>>
                }),
                auth,
            )
        };
        let request = |authorization: Option<&str>| {
            let mut request = http::Request::new(());
            if let Some(value) = authorization {
                request
                    .headers_mut()
                    .insert(AUTHORIZATION_KEY, value.parse().unwrap());
            }
            request
        };
        let tokens = || Some(ApiTokens::load(file(TOKEN).path()).unwrap());
        let refused = service(ApiAuth::new(tokens()))
            .oneshot(request(None))
            .await
            .unwrap();
        let status = Status::from_header_map(refused.headers()).unwrap();
        assert_eq!(status.code(), Code::Unauthenticated);
        assert_eq!(reason(&status), "TokenMissing");
        assert_eq!(
            refused.headers()["content-type"],
            "application/grpc",
            "a trailers-only gRPC answer"
        );
        assert!(tonic::codegen::Body::is_end_stream(refused.body()));
        assert_eq!(served.load(Ordering::SeqCst), 0);
        let bearer = format!("Bearer {TOKEN}");
        let passed = service(ApiAuth::new(tokens()))
            .oneshot(request(Some(&bearer)))
            .await
            .unwrap();
        assert_eq!(passed.headers()[AUTHORIZATION_KEY], bearer.as_str());
        let open = service(ApiAuth::new(None))
            .oneshot(request(None))
            .await
            .unwrap();
        assert!(open.headers().get(AUTHORIZATION_KEY).is_none());
        assert_eq!(served.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_check_lets_through_only_a_bearer_of_an_accepted_token() {
        let auth = ApiAuth::new(Some(ApiTokens::load(file(TOKEN).path()).unwrap()));
        assert!(call(&auth, Some(&format!("Bearer {TOKEN}"))).is_ok());
        assert!(call(&auth, Some(&format!("bearer {TOKEN}"))).is_ok());
        let missing = call(&auth, None).unwrap_err();
        assert_eq!(missing.code(), Code::Unauthenticated);
        assert_eq!(reason(&missing), "TokenMissing");
        assert!(missing.message().contains("--token"), "{missing:?}");
        let not_bearer = call(&auth, Some(&format!("Basic {TOKEN}"))).unwrap_err();
        assert_eq!(reason(&not_bearer), "TokenMissing");
        let refused = call(&auth, Some("Bearer another-token-0123456789")).unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
        assert_eq!(reason(&refused), "TokenRefused");
        // Without tokens everything passes, a token or not.
        let open = ApiAuth::new(None);
        assert!(call(&open, None).is_ok());
        assert!(call(&open, Some("Bearer anything")).is_ok());
    }
}
