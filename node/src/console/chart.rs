//! The console's depth over time: a bounded ring of samples the node takes of its queues'
//! counts ([`DepthHistory`]), and the inline SVG drawn from it on the server ([`svg`]).
//!
//! Pure: time is an argument, and the SVG holds only numbers and fixed text (no queue name or
//! other input reaches it, so it needs no escaping).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use trireme_core::{Millis, QueueName, QueueStats};

use crate::limits;

/// One queue's counts at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Depth {
    /// Messages a receive could take.
    pub ready: u64,
    /// Messages received and not yet deleted or visible again.
    pub in_flight: u64,
}

impl Depth {
    /// The depth `stats` report.
    #[must_use]
    pub fn of(stats: &QueueStats) -> Depth {
        Depth {
            ready: stats.counts.ready,
            in_flight: stats.counts.in_flight,
        }
    }
}

/// The last `limits::console_samples_max` samples of every queue's depth, oldest first. A
/// queue that is gone is dropped from every sample with the next one taken without it.
#[derive(Debug, Default)]
pub struct DepthHistory {
    samples: VecDeque<(Millis, BTreeMap<QueueName, Depth>)>,
}

impl DepthHistory {
    /// Adds a sample of `queues` taken at `at`, dropping the oldest beyond the cap.
    pub fn record(&mut self, at: Millis, queues: &[QueueStats]) {
        let sample: BTreeMap<QueueName, Depth> = queues
            .iter()
            .map(|stats| (stats.name.clone(), Depth::of(stats)))
            .collect();
        // A deleted queue's past is no longer shown: keeping it would grow the ring by names.
        for (_, older) in &mut self.samples {
            older.retain(|name, _| sample.contains_key(name));
        }
        self.samples.push_back((at, sample));
        while self.samples.len() > limits::console_samples_max {
            self.samples.pop_front();
        }
        assert!(self.samples.len() <= limits::console_samples_max);
    }

    /// `queue`'s samples, oldest first (an instant it did not exist is left out).
    #[must_use]
    pub fn of(&self, queue: &QueueName) -> Vec<(Millis, Depth)> {
        self.samples
            .iter()
            .filter_map(|(at, sample)| Some((*at, *sample.get(queue)?)))
            .collect()
    }

    /// Samples held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample was taken yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// An SVG of `points` (oldest first; the last is usually now's live counts) over the window
/// `[now − window_ms, now]`, `width` × `height` pixels: ready as a filled area, in flight as a
/// dashed line, both on one scale from 0 to the largest value shown (at least 1). With `axis`,
/// the largest value and the window are written on it.
#[must_use]
pub fn svg(
    points: &[(Millis, Depth)],
    now: Millis,
    window_ms: u64,
    width: u32,
    height: u32,
    axis: bool,
) -> String {
    let start = now.0.saturating_sub(window_ms);
    let shown: Vec<(Millis, Depth)> = points
        .iter()
        .copied()
        .filter(|(at, _)| at.0 >= start && at.0 <= now.0)
        .collect();
    let top = shown
        .iter()
        .map(|(_, depth)| depth.ready.max(depth.in_flight))
        .max()
        .unwrap_or(0)
        .max(1);
    let (w, h) = (f64::from(width), f64::from(height));
    let x = |at: Millis| (at.0.saturating_sub(start)) as f64 / window_ms.max(1) as f64 * w;
    let y = |value: u64| h - 1.0 - value as f64 / top as f64 * (h - 2.0);
    let span = span(window_ms);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="depth over the last {span}, up to {top}">"#,
    );
    let _ = write!(
        out,
        r#"<rect x="0" y="0" width="{width}" height="{height}" class="frame"/>"#
    );
    if let (Some(first), Some(last)) = (shown.first(), shown.last()) {
        let mut area = format!("M{:.1},{:.1}", x(first.0), h - 1.0);
        let mut line = String::new();
        for (index, (at, depth)) in shown.iter().enumerate() {
            let _ = write!(area, " L{:.1},{:.1}", x(*at), y(depth.ready));
            let _ = write!(
                line,
                "{}{:.1},{:.1}",
                if index == 0 { "M" } else { " L" },
                x(*at),
                y(depth.in_flight)
            );
        }
        let _ = write!(area, " L{:.1},{:.1} Z", x(last.0), h - 1.0);
        let _ = write!(out, r#"<path class="ready" d="{area}"/>"#);
        let _ = write!(out, r#"<path class="in-flight" d="{line}"/>"#);
    }
    if axis {
        let _ = write!(
            out,
            r#"<text x="4" y="12" class="axis">{top}</text><text x="4" y="{bottom:.0}" class="axis">−{span}</text><text x="{right:.0}" y="{bottom:.0}" class="axis" text-anchor="end">now</text>"#,
            bottom = h - 4.0,
            right = w - 4.0,
        );
    }
    out.push_str("</svg>");
    out
}

/// A window's length as the axis writes it: seconds under two minutes, else minutes.
fn span(window_ms: u64) -> String {
    if window_ms < 120_000 {
        format!("{} s", window_ms / 1_000)
    } else {
        format!("{} min", window_ms / 60_000)
    }
}

/// The window a chart of `points` (oldest first) shows at `now`: from its oldest point, at
/// least `shortest_ms` (a new queue's few samples are not squeezed into one edge) and at most
/// `longest_ms` (what the ring holds).
#[must_use]
pub fn window_ms(
    points: &[(Millis, Depth)],
    now: Millis,
    shortest_ms: u64,
    longest_ms: u64,
) -> u64 {
    let oldest = points.first().map_or(now, |(at, _)| *at);
    now.0
        .saturating_sub(oldest.0)
        .clamp(shortest_ms, longest_ms)
}

#[cfg(test)]
mod tests {
    use trireme_core::MessageCounts;

    use super::*;

    fn stats(name: &str, ready: u64) -> QueueStats {
        QueueStats {
            name: QueueName::try_from(name.to_owned()).unwrap(),
            counts: MessageCounts {
                ready,
                in_flight: 0,
                delayed: 0,
            },
            oldest_sent_at: None,
            dead_letter_moves: 0,
        }
    }

    #[test]
    fn the_ring_keeps_only_the_newest_samples_and_forgets_deleted_queues() {
        let mut history = DepthHistory::default();
        let orders = QueueName::try_from("orders".to_owned()).unwrap();
        let gone = QueueName::try_from("gone".to_owned()).unwrap();
        for i in 0..(limits::console_samples_max as u64 + 10) {
            history.record(Millis(i * 1_000), &[stats("orders", i), stats("gone", i)]);
        }
        assert_eq!(history.len(), limits::console_samples_max);
        let kept = history.of(&orders);
        assert_eq!(
            kept.first().unwrap().0,
            Millis(10_000),
            "the oldest ten went"
        );
        assert_eq!(
            kept.last().unwrap().1.ready,
            limits::console_samples_max as u64 + 9
        );
        history.record(Millis(1_000_000), &[stats("orders", 1)]);
        assert!(history.of(&gone).is_empty());
    }

    #[test]
    fn the_chart_scales_to_the_largest_value_and_leaves_out_what_is_outside_its_window() {
        let points = [
            (
                Millis(0),
                Depth {
                    ready: 1_000,
                    in_flight: 0,
                },
            ),
            (
                Millis(50_000),
                Depth {
                    ready: 4,
                    in_flight: 2,
                },
            ),
            (
                Millis(100_000),
                Depth {
                    ready: 8,
                    in_flight: 0,
                },
            ),
        ];
        let drawn = svg(&points, Millis(100_000), 60_000, 200, 50, true);
        assert!(drawn.starts_with("<svg"), "{drawn}");
        assert!(
            drawn.contains(">8</text>"),
            "scaled to 8, not 1000: {drawn}"
        );
        // ready 8 at now is the top of the chart; the point at 50 s sits a sixth across.
        assert!(drawn.contains("L200.0,1.0"), "{drawn}");
        assert!(drawn.contains("L33.3,25.0"), "{drawn}");
        assert!(drawn.contains(">−60 s</text>"), "{drawn}");
        assert_eq!(
            window_ms(&points, Millis(100_000), 30_000, 600_000),
            100_000
        );
        assert_eq!(
            window_ms(&points[2..], Millis(100_000), 30_000, 600_000),
            30_000
        );
        assert_eq!(
            window_ms(&points, Millis(10_000_000), 30_000, 600_000),
            600_000
        );
        let empty = svg(&[], Millis(100_000), 60_000, 200, 50, false);
        assert!(!empty.contains("<path"), "{empty}");
    }
}
