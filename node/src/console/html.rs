//! The console's HTML, written by hand: [`Html`] takes markup only as `&'static str` (text the
//! code itself holds) and everything else through [`Html::text`], which escapes it. So no queue
//! name, tag, body or error text can become markup: there is no way to pass one unescaped.

use std::fmt::Display;

/// `text` with `&`, `<`, `>`, `"` and `'` escaped, safe inside an element and inside a quoted
/// attribute value.
#[must_use]
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page being written.
#[derive(Debug, Default)]
pub struct Html {
    out: String,
}

impl Html {
    /// Markup the code holds.
    pub fn raw(&mut self, markup: &'static str) -> &mut Html {
        self.out.push_str(markup);
        self
    }

    /// Text from anywhere, escaped.
    pub fn text(&mut self, text: &str) -> &mut Html {
        self.out.push_str(&escape(text));
        self
    }

    /// A value's `Display`, escaped (numbers, ids, errors).
    pub fn show(&mut self, value: impl Display) -> &mut Html {
        self.text(&value.to_string())
    }

    /// An SVG drawn by `chart::svg`, which writes only numbers and fixed text.
    pub fn svg(&mut self, chart: &Chart) -> &mut Html {
        self.out.push_str(&chart.0);
        self
    }

    /// `<a href="HREF">TEXT</a>`, both escaped.
    pub fn link(&mut self, href: &str, text: &str) -> &mut Html {
        self.raw("<a href=\"")
            .text(href)
            .raw("\">")
            .text(text)
            .raw("</a>")
    }

    /// A hidden form field, escaped.
    pub fn hidden(&mut self, name: &'static str, value: &str) -> &mut Html {
        self.raw("<input type=\"hidden\" name=\"")
            .raw(name)
            .raw("\" value=\"")
            .text(value)
            .raw("\">")
    }

    /// The page's text.
    #[must_use]
    pub fn finish(self) -> String {
        self.out
    }
}

/// An SVG chart, made only by `chart::svg` (numbers and fixed text).
#[derive(Debug)]
pub struct Chart(pub(super) String);

/// The style of every page: plain CSS, no script anywhere.
pub const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#fafafa}\
header{background:#123;color:#fff;padding:.6em 1em;display:flex;gap:1.5em;align-items:baseline}\
header a{color:#cde}header .node{margin-left:auto;color:#9ab}main{padding:1em 1.5em;max-width:72em}\
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border-bottom:1px solid #ddd;padding:.3em .8em;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}code.body{white-space:pre-wrap;word-break:break-all}\
.chart .frame{fill:#fff;stroke:#ccd}.chart .ready{fill:#9cc3e6;stroke:#2c6fa8}.chart .in-flight{fill:none;stroke:#c9641e;stroke-dasharray:4 2}\
.chart .axis{font-size:10px;fill:#667}.up{color:#17702f;font-weight:bold}.down{color:#b3261e;font-weight:bold}\
.note{color:#555;font-size:90%}.warn{background:#fff4ce;border:1px solid #e5c100;padding:.4em .8em}\
.error{background:#fde7e9;border:1px solid #b3261e;padding:.4em .8em}form.inline{display:inline}\
button{font:inherit;padding:.2em .8em}label{display:block;margin:.4em 0}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_markup_character_is_escaped() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        let mut page = Html::default();
        page.raw("<td>")
            .text("</td><img src=x onerror=1>")
            .raw("</td>");
        page.link("/console/queues/a\"b", "<b>");
        page.hidden("csrf", "\"><script>");
        let page = page.finish();
        assert!(!page.contains("<img"), "{page}");
        assert!(!page.contains("<b>"), "{page}");
        assert!(!page.contains("\"><script>"), "{page}");
        assert!(page.contains("a&quot;b"), "{page}");
    }
}
