//! The web console: what an operator sees of a node and its cluster in a browser, served on the
//! metrics listener under `/console` (off with `--no-console`).
//!
//! Pages are rendered here on the server as plain HTML and read the same with JavaScript off
//! (there is none): the queues with their depths and a depth-over-time chart (inline SVG drawn
//! from the samples [`Console::sample`] keeps in a bounded ring); a queue's page (attributes,
//! redrive policy, counts, a peek at its messages that receives nothing, and for a dead-letter
//! queue its messages' receive counts and sources and a redrive with its progress); the nodes
//! page (each member up or down, anti-entropy, clock offset, version as each peer's clock probe
//! answers it).
//!
//! Access follows the SQS endpoint's keys: when keys are configured, a session is opened by a
//! login with an access key id and its secret; without keys anyone who reaches the listener may
//! act (the page says so). Every visitor gets a session cookie (`HttpOnly`, `SameSite=Strict`,
//! path `/console`), and every form carries its session's CSRF token, which a POST must return;
//! an action (a redrive) asks for confirmation on a page of its own before it acts. Sessions are
//! bounded in number and age (`limits::console_sessions_max`, `console_session_ttl_s`); when
//! they are full, sessions not logged in go first.
//!
//! Why the metrics listener: it is the operator's port already (loopback by default, never the
//! clients' API), so the console needs no address of its own and is off wherever the metrics
//! are. This module only reads and starts move tasks through the backend; it never decides queue
//! semantics, and every text it shows passes through [`html::Html::text`].

pub mod chart;
pub mod html;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use trireme_core::{Millis, QueueName, QueueStats, QueueView, RedriveAllow};

use self::chart::{Depth, DepthHistory};
use self::html::{Chart, Html, STYLE};
use crate::backend::Backend;
use crate::cluster::Cluster;
use crate::limits;
use crate::metrics::Metrics;
use crate::redrive::{RedriveProgress, RedriveStatus};
use crate::sqs::AccessKey;

/// The session cookie's name.
const COOKIE: &str = "trireme_console";

/// The console of one node. Built by [`crate::Node`], served by [`router`].
pub struct Console {
    backend: Backend,
    metrics: Arc<Metrics>,
    cluster: Option<Cluster>,
    /// The SQS endpoint's keys; empty: no login.
    access_keys: Vec<AccessKey>,
    sessions: Mutex<BTreeMap<String, Session>>,
    history: Mutex<DepthHistory>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("login", &!self.access_keys.is_empty())
            .finish_non_exhaustive()
    }
}

/// One browser's session.
#[derive(Clone, Debug)]
struct Session {
    /// The token every form of this session carries.
    csrf: String,
    /// The access key id it logged in with; `None`: not logged in (or no keys configured).
    key_id: Option<String>,
    /// When it ends, whatever it does meanwhile.
    expires: Instant,
}

/// 128 random bits as hex, for session and CSRF tokens (rand's thread generator is a CSPRNG).
fn token() -> String {
    let bits: u128 = rand::random();
    format!("{bits:032x}")
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths (a secret's
/// comparison must not say how much of it was right).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session token `headers` carry in the console's cookie.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|value| value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn set_cookie(token: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        limits::console_session_ttl_s
    ))
    .expect("hex is a valid header value")
}

/// Drops sessions until fewer than `max` are left: first those not logged in (anyone can open
/// those by the thousand, and they must not push out an operator's), the one ending soonest
/// first.
fn make_room(sessions: &mut BTreeMap<String, Session>, max: usize) {
    while sessions.len() >= max {
        let soonest = sessions
            .iter()
            .min_by_key(|(_, session)| (session.key_id.is_some(), session.expires))
            .map(|(token, _)| token.clone())
            .expect("the map is not empty");
        sessions.remove(&soonest);
    }
}

/// The session a request belongs to, and the cookie to set when it was opened now.
struct Visit {
    token: String,
    session: Session,
    new_cookie: bool,
}

impl Console {
    /// The console of a node serving through `backend`, its figures from `metrics`, a member's
    /// state from `cluster`; a login is asked for when `access_keys` is not empty.
    #[must_use]
    pub fn new(
        backend: Backend,
        metrics: Arc<Metrics>,
        cluster: Option<Cluster>,
        access_keys: Vec<AccessKey>,
    ) -> Console {
        Console {
            backend,
            metrics,
            cluster,
            access_keys,
            sessions: Mutex::new(BTreeMap::new()),
            history: Mutex::new(DepthHistory::default()),
        }
    }

    /// Whether a login is needed (the SQS endpoint has keys).
    fn login_required(&self) -> bool {
        !self.access_keys.is_empty()
    }

    /// Takes one sample of every queue's depth into the ring (the sampler calls it every
    /// `limits::console_sample_period_ms`).
    ///
    /// # Errors
    /// As `Metrics::queue_stats` (a node alone shutting down).
    pub async fn sample(&self) -> Result<(), crate::engine::EngineError> {
        let queues = self.metrics.queue_stats().await?;
        let now = self.backend.now();
        self.history
            .lock()
            .expect("the history lock is never poisoned")
            .record(now, &queues);
        Ok(())
    }

    /// The request's session: the one its cookie names if it is live, else a new one (not
    /// logged in). Expired sessions go first; beyond the cap, the one ending soonest goes.
    fn visit(&self, headers: &HeaderMap) -> Visit {
        let mut sessions = self
            .sessions
            .lock()
            .expect("the session lock is never poisoned");
        let now = Instant::now();
        sessions.retain(|_, session| session.expires > now);
        if let Some(token) = cookie_token(headers)
            && let Some(session) = sessions.get(&token)
        {
            return Visit {
                session: session.clone(),
                token,
                new_cookie: false,
            };
        }
        make_room(&mut sessions, limits::console_sessions_max);
        let token = token();
        let session = Session {
            csrf: self::token(),
            key_id: None,
            expires: now + Duration::from_secs(limits::console_session_ttl_s),
        };
        sessions.insert(token.clone(), session.clone());
        Visit {
            token,
            session,
            new_cookie: true,
        }
    }

    /// Whether `visit` may see and act: logged in, or no login needed.
    fn allowed(&self, visit: &Visit) -> bool {
        !self.login_required() || visit.session.key_id.is_some()
    }

    /// Whether a request naming `host` in its `Host` header is served. Without keys, only a
    /// host that is an IP address or `localhost`: a page of another site whose name an attacker
    /// points at this address afterwards (DNS rebinding) names its own host, and would
    /// otherwise read the pages and their CSRF token as same-origin. With keys, any host (it
    /// needs a login all the same).
    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        if self.login_required() {
            return true;
        }
        headers
            .get(header::HOST)
            .and_then(|value| value.to_str().ok())
            .is_some_and(host_is_local)
    }
}

/// Whether `host` (a `Host` header: `[::1]:9100`, `127.0.0.1:9100`, `localhost:9100`, or any of
/// them without the port) names an IP address or `localhost`.
fn host_is_local(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Refuses a request whose `Host` the console does not serve ([`Console::host_allowed`]).
async fn check_host(
    State(console): State<Arc<Console>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if console.host_allowed(request.headers()) {
        next.run(request).await
    } else {
        (
            StatusCode::MISDIRECTED_REQUEST,
            "The console without a login answers only a host that is an IP address or \
             localhost (configure SQS access keys to reach it by name).\n",
        )
            .into_response()
    }
}

/// The console's routes, under `/console`.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/console", get(queues_page))
        .route("/console/", get(queues_page))
        .route("/console/queues/{name}", get(queue_page))
        .route("/console/queues/{name}/redrive", post(redrive))
        .route("/console/nodes", get(nodes_page))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        // Forms are a few short fields; anything larger is not one of ours.
        .layer(DefaultBodyLimit::max(limits::console_form_bytes_max))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&console),
            check_host,
        ))
        .with_state(console)
}

/// An HTML answer with the headers every page gets: no caching, no sniffing, no framing, no
/// script of any origin (the pages have none), and the session cookie when it is new.
fn page(visit: &Visit, status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if visit.new_cookie {
        headers.insert(header::SET_COOKIE, set_cookie(&visit.token));
    }
    response
}

fn redirect(visit: &Visit, to: &str) -> Response {
    let mut response = Redirect::to(to).into_response();
    if visit.new_cookie {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, set_cookie(&visit.token));
    }
    response
}

/// The page's head and navigation; `refresh_s`: reload after that many seconds (a running
/// redrive's progress), done by the browser without script.
fn open(out: &mut Html, console: &Console, visit: &Visit, title: &str, refresh_s: Option<u32>) {
    out.raw("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    if let Some(seconds) = refresh_s {
        out.raw("<meta http-equiv=\"refresh\" content=\"")
            .show(seconds)
            .raw("\">");
    }
    out.raw("<title>")
        .text(title)
        .raw(" · Trireme console</title><style>")
        .raw(STYLE)
        .raw("</style></head><body><header><strong>Trireme</strong>")
        .raw("<a href=\"/console\">Queues</a><a href=\"/console/nodes\">Nodes</a>")
        .raw("<span class=\"node\">");
    match &console.cluster {
        Some(cluster) => out.raw("node ").show(cluster.node().0),
        None => out.raw("single node"),
    };
    out.raw(" · v").text(env!("CARGO_PKG_VERSION"));
    if let Some(key) = &visit.session.key_id {
        out.raw(" · ").text(key).raw(" ");
        out.raw("<form class=\"inline\" method=\"post\" action=\"/console/logout\">")
            .hidden("csrf", &visit.session.csrf)
            .raw("<button>Log out</button></form>");
    }
    out.raw("</span></header><main>");
    if !console.login_required() {
        out.raw(
            "<p class=\"warn\">No SQS access keys are configured: anyone who reaches this \
             port can use the console. Configure keys (--sqs-access-key ID:SECRET) to require a login, \
             or turn it off with --no-console.</p>",
        );
    }
}

fn close(mut out: Html) -> String {
    out.raw("</main></body></html>");
    out.finish()
}

fn error_page(console: &Console, visit: &Visit, status: StatusCode, message: &str) -> Response {
    let mut out = Html::default();
    open(&mut out, console, visit, "Error", None);
    out.raw("<p class=\"error\">").text(message).raw("</p>");
    page(visit, status, close(out))
}

/// "12 s", "3 min", "2 h", "4 d": how long ago `at` was at `now`.
fn age(now: Millis, at: Millis) -> String {
    let seconds = now.0.saturating_sub(at.0) / 1_000;
    match seconds {
        0..120 => format!("{seconds} s"),
        120..7_200 => format!("{} min", seconds / 60),
        7_200..172_800 => format!("{} h", seconds / 3_600),
        _ => format!("{} d", seconds / 86_400),
    }
}

/// The chart of `queue` from the ring, with `live` (now's counts) as its last point.
fn chart_of(console: &Console, queue: &QueueName, live: Depth, width: u32, height: u32) -> Chart {
    let now = console.backend.now();
    let mut points = console
        .history
        .lock()
        .expect("the history lock is never poisoned")
        .of(queue);
    points.push((now, live));
    let longest_ms = limits::console_sample_period_ms * limits::console_samples_max as u64;
    let window_ms = chart::window_ms(
        &points,
        now,
        limits::console_chart_window_ms_min,
        longest_ms,
    );
    Chart(chart::svg(
        &points,
        now,
        window_ms,
        width,
        height,
        height >= 60,
    ))
}

async fn queues_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let visit = console.visit(&headers);
    if !console.allowed(&visit) {
        return redirect(&visit, "/console/login");
    }
    let queues = match console.metrics.queue_stats().await {
        Ok(queues) => queues,
        Err(error) => {
            return error_page(
                &console,
                &visit,
                StatusCode::SERVICE_UNAVAILABLE,
                &error.to_string(),
            );
        }
    };
    let now = console.backend.now();
    let mut out = Html::default();
    open(&mut out, &console, &visit, "Queues", None);
    out.raw("<h1>Queues</h1>");
    if console.cluster.is_some() {
        out.raw(
            "<p class=\"note\">Counts are this member's local view (as GetQueueAttributes \
             answers here): approximate, as SQS's are.</p>",
        );
    }
    if queues.is_empty() {
        out.raw("<p>No queues yet.</p>");
    } else {
        out.raw(
            "<table id=\"queues\"><thead><tr><th>Queue</th><th>Ready</th><th>In flight</th>\
             <th>Delayed</th><th>Oldest</th><th>Depth (up to ",
        )
        .show(limits::console_sample_period_ms * limits::console_samples_max as u64 / 60_000)
        .raw(" min)</th></tr></thead><tbody>");
        for stats in queues.iter().take(limits::console_queues_per_page_max) {
            queue_row(&mut out, &console, stats, now);
        }
        out.raw("</tbody></table>");
        if queues.len() > limits::console_queues_per_page_max {
            out.raw("<p class=\"note\">")
                .show(queues.len() - limits::console_queues_per_page_max)
                .raw(" more queues are not shown (the page lists at most ")
                .show(limits::console_queues_per_page_max)
                .raw(").</p>");
        }
    }
    out.raw(
        "<p class=\"note\">Chart: ready (blue area) and in flight (orange dashes), one sample \
         every ",
    )
    .show(limits::console_sample_period_ms / 1_000)
    .raw(" s and now. Reload the page to update.</p>");
    page(&visit, StatusCode::OK, close(out))
}

fn queue_row(out: &mut Html, console: &Console, stats: &QueueStats, now: Millis) {
    let name = stats.name.as_str();
    out.raw("<tr data-queue=\"").text(name).raw("\"><td>");
    out.link(&format!("/console/queues/{name}"), name);
    out.raw("</td><td class=\"n ready\">")
        .show(stats.counts.ready)
        .raw("</td><td class=\"n in-flight\">")
        .show(stats.counts.in_flight)
        .raw("</td><td class=\"n\">")
        .show(stats.counts.delayed)
        .raw("</td><td class=\"n\">");
    match stats.oldest_sent_at {
        Some(sent_at) => out.text(&age(now, sent_at)),
        None => out.raw("—"),
    };
    out.raw("</td><td>")
        .svg(&chart_of(console, &stats.name, Depth::of(stats), 160, 32))
        .raw("</td></tr>");
}

async fn queue_page(
    State(console): State<Arc<Console>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let visit = console.visit(&headers);
    if !console.allowed(&visit) {
        return redirect(&visit, "/console/login");
    }
    let Ok(queue) = QueueName::try_from(name.clone()) else {
        return error_page(
            &console,
            &visit,
            StatusCode::NOT_FOUND,
            &format!("{name:?} is not a queue name"),
        );
    };
    let view = match console.backend.queue(&queue).await {
        Ok(Some(view)) => view,
        Ok(None) => {
            return error_page(
                &console,
                &visit,
                StatusCode::NOT_FOUND,
                &format!("queue {queue} does not exist"),
            );
        }
        Err(error) => {
            return error_page(
                &console,
                &visit,
                StatusCode::SERVICE_UNAVAILABLE,
                &error.to_string(),
            );
        }
    };
    // Each part reads what it can; a part that fails says so and the page still shows.
    let sources = console.backend.dead_letter_sources(&queue).await;
    let tasks = if matches!(&sources, Ok(sources) if !sources.is_empty()) {
        console
            .backend
            .list_move_tasks(&queue, limits::console_move_tasks_shown_max)
            .await
            .map_err(|error| error.to_string())
    } else {
        Ok(Vec::new())
    };
    let peeked = console
        .backend
        .peek(&queue, limits::console_messages_per_page_max)
        .await;
    let running = matches!(&tasks, Ok(tasks) if tasks.iter().any(|task| matches!(task.status, RedriveStatus::Running | RedriveStatus::Cancelling)));
    let now = console.backend.now();
    let mut out = Html::default();
    open(
        &mut out,
        &console,
        &visit,
        queue.as_str(),
        running.then_some(2),
    );
    out.raw("<h1>Queue <span id=\"queue-name\">")
        .text(queue.as_str())
        .raw("</span></h1>");
    counts(&mut out, &console, &view);
    attributes(&mut out, &view);
    match &sources {
        Ok(sources) if !sources.is_empty() => {
            out.raw("<h2 id=\"redrive\">Dead-letter queue</h2><p>The dead-letter queue of ");
            for (index, source) in sources.iter().enumerate() {
                if index > 0 {
                    out.raw(", ");
                }
                out.link(&format!("/console/queues/{source}"), source.as_str());
            }
            out.raw(".</p>");
            redrive_section(&mut out, &visit, &queue, &tasks, now);
        }
        Ok(_) => {}
        Err(error) => {
            out.raw("<p class=\"error\">Its dead-letter sources cannot be read: ")
                .show(error)
                .raw("</p>");
        }
    }
    out.raw("<h2>Messages</h2><p class=\"note\">A peek: the first ")
        .show(limits::console_messages_per_page_max)
        .raw(
            " messages at most, the first sent first, shown without receiving them (no receive \
             count changes, nothing becomes invisible).",
        );
    if console.backend.is_cluster() {
        out.raw(
            " On a cluster this is this member's local replica view: it asks no other member, \
             and a copy this member has not received yet is not shown.",
        );
    }
    out.raw("</p>");
    match peeked {
        Ok(messages) if messages.is_empty() => {
            out.raw("<p id=\"messages-empty\">No messages.</p>");
        }
        Ok(messages) => {
            out.raw(
                "<table id=\"messages\"><thead><tr><th>Message id</th><th>State</th>\
                 <th>Receives</th><th>Sent</th><th>Source</th><th>Body</th></tr></thead><tbody>",
            );
            for message in &messages {
                out.raw("<tr><td><code>")
                    .show(message.id)
                    .raw("</code></td><td>")
                    .text(message.state.label())
                    .raw("</td><td class=\"n receive-count\">")
                    .show(message.receive_count)
                    .raw("</td><td class=\"n\">")
                    .text(&age(now, message.sent_at))
                    .raw(" ago</td><td>");
                match &message.source {
                    Some(source) => out.link(&format!("/console/queues/{source}"), source.as_str()),
                    None => out.raw("—"),
                };
                out.raw("</td><td><code class=\"body\">");
                let mut body: String = message
                    .body
                    .chars()
                    .take(limits::console_body_chars_max)
                    .collect();
                if body.len() < message.body.len() {
                    body.push('…');
                }
                out.text(&body).raw("</code></td></tr>");
            }
            out.raw("</tbody></table>");
        }
        Err(error) => {
            out.raw("<p class=\"error\">The messages cannot be read: ")
                .show(error)
                .raw("</p>");
        }
    }
    page(&visit, StatusCode::OK, close(out))
}

fn counts(out: &mut Html, console: &Console, view: &QueueView) {
    let depth = Depth {
        ready: view.counts.ready,
        in_flight: view.counts.in_flight,
    };
    out.raw("<table id=\"counts\"><tr><th>Ready</th><td class=\"n ready\">")
        .show(view.counts.ready)
        .raw("</td></tr><tr><th>In flight</th><td class=\"n in-flight\">")
        .show(view.counts.in_flight)
        .raw("</td></tr><tr><th>Delayed</th><td class=\"n\">")
        .show(view.counts.delayed)
        .raw("</td></tr></table>")
        .svg(&chart_of(console, &view.name, depth, 600, 120));
}

fn attributes(out: &mut Html, view: &QueueView) {
    let attributes = &view.attributes;
    out.raw("<h2>Attributes</h2><table id=\"attributes\">");
    let mut row = |name: &'static str, value: String| {
        out.raw("<tr><th>")
            .raw(name)
            .raw("</th><td>")
            .text(&value)
            .raw("</td></tr>");
    };
    row(
        "VisibilityTimeout",
        format!("{} s", attributes.visibility_timeout_s),
    );
    row("DelaySeconds", format!("{} s", attributes.delay_s));
    row(
        "MessageRetentionPeriod",
        format!("{} s", attributes.retention_s),
    );
    row(
        "MaximumMessageSize",
        format!("{} bytes", attributes.message_bytes_max),
    );
    row(
        "ReceiveMessageWaitTimeSeconds",
        format!("{} s", attributes.receive_wait_s),
    );
    row(
        "RedriveAllowPolicy",
        match &attributes.redrive_allow {
            RedriveAllow::AllowAll => "allow all".to_owned(),
            RedriveAllow::DenyAll => "deny all".to_owned(),
            RedriveAllow::ByQueue(queues) => format!(
                "by queue: {}",
                queues
                    .iter()
                    .map(QueueName::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    );
    for (key, value) in view.tags.iter().take(limits::console_tags_shown_max) {
        row("Tag", format!("{key} = {value}"));
    }
    out.raw("</table><h2>Redrive policy</h2>");
    match &attributes.redrive {
        Some(policy) => {
            out.raw("<p id=\"redrive-policy\">maxReceiveCount ")
                .show(policy.max_receive_count)
                .raw(": a message received that many times goes, at its next receive, to ");
            out.link(
                &format!("/console/queues/{}", policy.dead_letter_queue),
                policy.dead_letter_queue.as_str(),
            );
            out.raw(".</p>");
        }
        None => {
            out.raw(
                "<p id=\"redrive-policy\">None: messages stay however often they are received.</p>",
            );
        }
    }
}

fn redrive_section(
    out: &mut Html,
    visit: &Visit,
    queue: &QueueName,
    tasks: &Result<Vec<RedriveProgress>, String>,
    now: Millis,
) {
    out.raw("<form method=\"post\" action=\"/console/queues/")
        .text(queue.as_str())
        .raw("/redrive\">")
        .hidden("csrf", &visit.session.csrf)
        .raw(
            "<button id=\"redrive-start\">Redrive to the source queues…</button> \
             <span class=\"note\">(asks for confirmation; moves every message ready now)</span>\
             </form>",
        );
    match tasks {
        Ok(tasks) if tasks.is_empty() => {
            out.raw("<p class=\"note\" id=\"redrive-tasks\">No redrive yet.</p>");
        }
        Ok(tasks) => {
            out.raw(
                "<table id=\"redrive-tasks\"><thead><tr><th>Started</th><th>Status</th>\
                 <th>Moved</th><th>Failed</th><th>Of</th><th>Progress</th></tr></thead><tbody>",
            );
            for task in tasks {
                let status = match &task.status {
                    RedriveStatus::Running => "running".to_owned(),
                    RedriveStatus::Completed => "completed".to_owned(),
                    RedriveStatus::Cancelling => "cancelling".to_owned(),
                    RedriveStatus::Cancelled => "cancelled".to_owned(),
                    RedriveStatus::Failed(failure) => format!("failed: {failure}"),
                };
                let done = task.moved + task.failed;
                out.raw("<tr><td>")
                    .text(&age(now, task.started_at))
                    .raw(" ago</td><td class=\"status\">")
                    .text(&status)
                    .raw("</td><td class=\"n moved\">")
                    .show(task.moved)
                    .raw("</td><td class=\"n\">")
                    .show(task.failed)
                    .raw("</td><td class=\"n\">")
                    .show(task.to_move)
                    .raw("</td><td><progress max=\"")
                    .show(task.to_move.max(1))
                    .raw("\" value=\"")
                    .show(done.min(task.to_move.max(1)))
                    .raw("\"></progress></td></tr>");
            }
            out.raw("</tbody></table>");
        }
        Err(error) => {
            out.raw("<p class=\"error\">The redrive tasks cannot be read: ")
                .text(error)
                .raw("</p>");
        }
    }
}

/// A form's fields: the CSRF token, and `confirm=yes` once confirmed.
#[derive(Debug, Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
}

/// Whether `form` carries the session's CSRF token (a form of another site cannot know it).
fn csrf_ok(visit: &Visit, sent: &str) -> bool {
    !visit.new_cookie && same(sent.as_bytes(), visit.session.csrf.as_bytes())
}

async fn redrive(
    State(console): State<Arc<Console>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<ActionForm>,
) -> Response {
    let visit = console.visit(&headers);
    if !console.allowed(&visit) {
        return redirect(&visit, "/console/login");
    }
    if !csrf_ok(&visit, &form.csrf) {
        return error_page(
            &console,
            &visit,
            StatusCode::FORBIDDEN,
            "The form's token does not match this session: nothing was done. Open the page \
             again and resubmit.",
        );
    }
    let Ok(queue) = QueueName::try_from(name.clone()) else {
        return error_page(
            &console,
            &visit,
            StatusCode::NOT_FOUND,
            &format!("{name:?} is not a queue name"),
        );
    };
    if form.confirm != "yes" {
        let ready = match console.backend.queue(&queue).await {
            Ok(Some(view)) => view.counts.ready,
            _ => 0,
        };
        let mut out = Html::default();
        open(&mut out, &console, &visit, "Confirm redrive", None);
        out.raw("<h1>Redrive ")
            .text(queue.as_str())
            .raw("?</h1><p>Every message ready in the dead-letter queue now (")
            .show(ready)
            .raw(
                ") moves back to the queue it came from, with its receive count reset. This \
                 cannot be undone.</p><form method=\"post\" action=\"/console/queues/",
            )
            .text(queue.as_str())
            .raw("/redrive\">")
            .hidden("csrf", &visit.session.csrf)
            .hidden("confirm", "yes")
            .raw("<button id=\"redrive-confirm\">Yes, redrive</button> ");
        out.link(&format!("/console/queues/{queue}"), "Cancel");
        out.raw("</form>");
        return page(&visit, StatusCode::OK, close(out));
    }
    match console
        .backend
        .start_move_task(queue.clone(), None, None, None)
        .await
    {
        Ok(handle) => {
            tracing::info!(queue = %queue, task = %handle, key = ?visit.session.key_id, "redrive started from the console");
            redirect(&visit, &format!("/console/queues/{queue}#redrive"))
        }
        Err(error) => error_page(&console, &visit, StatusCode::CONFLICT, &error.to_string()),
    }
}

async fn nodes_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let visit = console.visit(&headers);
    if !console.allowed(&visit) {
        return redirect(&visit, "/console/login");
    }
    let mut out = Html::default();
    open(&mut out, &console, &visit, "Nodes", None);
    out.raw("<h1>Nodes</h1>");
    let readiness = console.metrics.readiness();
    let version = env!("CARGO_PKG_VERSION");
    match &console.cluster {
        None => {
            out.raw(
                "<p>This node runs alone (no cluster configured).</p><table id=\"nodes\">\
                 <thead><tr><th>Node</th><th>State</th><th>Version</th></tr></thead><tbody>\
                 <tr><td>this node</td><td>",
            );
            ready_cell(&mut out, &readiness);
            out.raw("</td><td>")
                .text(version)
                .raw("</td></tr></tbody></table>");
        }
        Some(cluster) => {
            let member = cluster.member_state();
            let replication = cluster.metrics();
            out.raw(
                "<table id=\"nodes\"><thead><tr><th>Node</th><th>State</th>\
                 <th>Clock offset</th><th>Anti-entropy rounds</th><th>Anti-entropy failures</th>\
                 <th>Records pushed / pulled</th><th>Version</th></tr></thead><tbody>",
            );
            out.raw("<tr data-node=\"")
                .show(cluster.node().0)
                .raw("\"><td>")
                .show(cluster.node().0)
                .raw(" (this one)</td><td>");
            ready_cell(&mut out, &readiness);
            out.raw("</td><td>—</td><td colspan=\"3\" class=\"note\">per peer, below</td><td>")
                .text(version)
                .raw("</td></tr>");
            for peer in &member.peers {
                let exchange = replication.anti_entropy(peer.peer);
                out.raw("<tr data-node=\"")
                    .show(peer.peer)
                    .raw("\"><td>")
                    .show(peer.peer)
                    .raw("</td><td>");
                if peer.up {
                    out.raw("<span class=\"up\">up</span>");
                } else {
                    out.raw("<span class=\"down\">down</span>");
                }
                out.raw("</td><td class=\"n\">");
                match peer.offset_ms {
                    Some(offset_ms) => out.show(offset_ms).raw(" ms"),
                    None => out.raw("no fresh sample"),
                };
                out.raw("</td><td class=\"n\">")
                    .show(exchange.rounds)
                    .raw("</td><td class=\"n\">")
                    .show(exchange.failures)
                    .raw("</td><td class=\"n\">")
                    .show(exchange.pushed)
                    .raw(" / ")
                    .show(exchange.pulled)
                    .raw("</td><td>");
                match &peer.version {
                    Some(version) => out.text(version),
                    None => out.raw("<span class=\"note\">not heard yet</span>"),
                };
                out.raw("</td></tr>");
            }
            out.raw("</tbody></table>");
            if let Some(reason) = &member.not_joined {
                out.raw("<p class=\"warn\">This member has not joined: ")
                    .text(reason)
                    .raw("</p>");
            }
            if let Some(fault) = &member.store_fault {
                out.raw("<p class=\"error\">The replica store failed: ")
                    .text(fault)
                    .raw("</p>");
            }
            out.raw(
                "<p class=\"note\">Up: the peer answered a clock probe recently. Clock offset: \
                 the peer's clock minus this node's, estimated from the probes' round trips. \
                 Anti-entropy: rounds this node completed with the peer since it started. \
                 Version: as the peer's latest clock probe answer gave it.</p>",
            );
        }
    }
    page(&visit, StatusCode::OK, close(out))
}

fn ready_cell(out: &mut Html, readiness: &Result<(), String>) {
    match readiness {
        Ok(()) => out.raw("<span class=\"up\">ready</span>"),
        Err(reason) => out
            .raw("<span class=\"down\">not ready</span>: ")
            .text(reason),
    };
}

async fn login_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let visit = console.visit(&headers);
    login_form(&console, &visit, StatusCode::OK, None)
}

fn login_form(
    console: &Console,
    visit: &Visit,
    status: StatusCode,
    problem: Option<&str>,
) -> Response {
    if !console.login_required() {
        return redirect(visit, "/console");
    }
    let mut out = Html::default();
    open(&mut out, console, visit, "Log in", None);
    out.raw("<h1>Log in</h1>");
    if let Some(problem) = problem {
        out.raw("<p class=\"error\">").text(problem).raw("</p>");
    }
    out.raw(
        "<p>With one of the SQS endpoint's access keys.</p>\
         <form method=\"post\" action=\"/console/login\">",
    )
    .hidden("csrf", &visit.session.csrf)
    .raw(
        "<label>Access key id <input name=\"access_key\" autocomplete=\"username\" required></label>\
         <label>Secret access key <input name=\"secret\" type=\"password\" \
         autocomplete=\"current-password\" required></label><button id=\"login\">Log in</button></form>",
    );
    page(visit, status, close(out))
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    access_key: String,
    #[serde(default)]
    secret: String,
}

async fn login(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    let visit = console.visit(&headers);
    if !console.login_required() {
        return redirect(&visit, "/console");
    }
    if !csrf_ok(&visit, &form.csrf) {
        return login_form(
            &console,
            &visit,
            StatusCode::FORBIDDEN,
            Some("The form expired: log in again."),
        );
    }
    let known = console.access_keys.iter().find(|key| {
        // Every key's secret is compared, so the time does not say which id exists. A key
        // limited to some queues (`queue_prefixes`) does not open the console, which shows and
        // redrives every queue.
        same(key.id.as_bytes(), form.access_key.as_bytes())
            & same(key.secret.as_bytes(), form.secret.as_bytes())
            & key.queue_prefixes.is_empty()
    });
    let Some(key) = known else {
        tracing::warn!(access_key = %form.access_key, "console login refused");
        return login_form(
            &console,
            &visit,
            StatusCode::UNAUTHORIZED,
            Some("Unknown access key or wrong secret."),
        );
    };
    // A new token at login: a token planted before it (session fixation) is worth nothing.
    let mut sessions = console
        .sessions
        .lock()
        .expect("the session lock is never poisoned");
    sessions.remove(&visit.token);
    let fresh = token();
    let session = Session {
        csrf: token(),
        key_id: Some(key.id.clone()),
        expires: Instant::now() + Duration::from_secs(limits::console_session_ttl_s),
    };
    sessions.insert(fresh.clone(), session.clone());
    drop(sessions);
    tracing::info!(access_key = %key.id, "console login");
    redirect(
        &Visit {
            token: fresh,
            session,
            new_cookie: true,
        },
        "/console",
    )
}

async fn logout(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<ActionForm>,
) -> Response {
    let visit = console.visit(&headers);
    if csrf_ok(&visit, &form.csrf) {
        console
            .sessions
            .lock()
            .expect("the session lock is never poisoned")
            .remove(&visit.token);
    }
    let mut response = Redirect::to("/console/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "trireme_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_read_only_in_the_token_shape() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; trireme_console=0123456789abcdef0123456789abcdef"),
        );
        assert_eq!(
            cookie_token(&headers).as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("trireme_console=<x>"),
        );
        assert_eq!(cookie_token(&headers), None);
    }

    #[test]
    fn without_keys_only_an_address_or_localhost_is_served() {
        let allowed = host_is_local;
        for host in [
            "127.0.0.1:9100",
            "localhost:9100",
            "LOCALHOST",
            "[::1]:9100",
            "10.0.0.3",
        ] {
            assert!(allowed(host), "{host}");
        }
        for host in ["evil.example:9100", "localhost.evil.example", "node1:9100"] {
            assert!(!allowed(host), "{host}");
        }
    }

    #[test]
    fn a_full_session_table_drops_the_sessions_not_logged_in_first() {
        let now = Instant::now();
        let session = |key_id: Option<&str>, seconds: u64| Session {
            csrf: String::new(),
            key_id: key_id.map(str::to_owned),
            expires: now + Duration::from_secs(seconds),
        };
        let mut sessions = BTreeMap::from([
            ("operator".to_owned(), session(Some("AKID"), 10)),
            ("anonymous-late".to_owned(), session(None, 300)),
            ("anonymous-soon".to_owned(), session(None, 200)),
        ]);
        make_room(&mut sessions, 3);
        assert!(!sessions.contains_key("anonymous-soon"));
        make_room(&mut sessions, 2);
        assert_eq!(
            sessions.keys().collect::<Vec<_>>(),
            ["operator"],
            "the logged-in session ends soonest and stays"
        );
        make_room(&mut sessions, 1);
        assert!(sessions.is_empty());
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
    }

    #[test]
    fn ages_read_in_the_unit_that_fits() {
        assert_eq!(age(Millis(61_000), Millis(1_000)), "60 s");
        assert_eq!(age(Millis(600_000), Millis(0)), "10 min");
        assert_eq!(age(Millis(3 * 3_600_000), Millis(0)), "3 h");
        assert_eq!(age(Millis(0), Millis(5_000)), "0 s");
    }
}
