//! Queue URLs and ARNs: how this endpoint names a queue to clients, and how it reads the names
//! clients send back. URLs are `http://<advertised host>:<port>/<account>/<name>` so that a client
//! can reach the queue from where it is; ARNs are `arn:aws:sqs:<region>:<account>:<name>`.
//!
//! Queues live per region, as in SQS: a request acts on the queues of the region it was signed
//! for (spec/queue-core.md, *Queues per region are names with a region suffix*). The node's own
//! region's queues have bare names; another region's are `name@region`. [`Addresses`] is the
//! endpoint as one request sees it: [`Addresses::for_region`] makes it from the node's.
//!
//! Reading is lenient about the URL's host (a client may reach the node by another name than the
//! advertised one) and strict about the account: a queue of another account does not exist here.
//! This module only parses text; whether the queue exists is the engine's business.

use trireme_core::{QueueName, Reject};

/// Where this endpoint's queues live, as one request sees them: the parts every URL and ARN is
/// built from, and the region whose queues the request names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addresses {
    /// `http://host:port`, without a trailing slash.
    base_url: String,
    /// The 12-digit (or any) account id in URLs and ARNs.
    account: String,
    /// The node's configured region: its queues have bare names.
    home_region: String,
    /// The region of the request: the queues it names by URL or ARN are this region's.
    region: String,
}

/// Why a URL or ARN does not name a queue of this endpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// The text is not a URL with a `/<account>/<name>` path, or not an `arn:…:sqs:…` ARN.
    #[error("{text} is not a queue URL or ARN")]
    Malformed { text: String },
    /// Well formed, but for another account or region: no such queue exists here.
    #[error("{text} names a queue of another account or region")]
    Foreign { text: String },
}

impl Addresses {
    /// Addresses for queues served at `host:port` (an IPv6 literal gets its brackets) under
    /// `account`, for requests of the node's own `region`.
    #[must_use]
    pub fn new(host: &str, port: u16, account: &str, region: &str) -> Self {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        Addresses {
            base_url: format!("http://{host}:{port}"),
            account: account.to_owned(),
            home_region: region.to_owned(),
            region: region.to_owned(),
        }
    }

    /// The same endpoint as a request signed for `region` sees it.
    #[must_use]
    pub fn for_region(&self, region: &str) -> Self {
        Addresses {
            region: region.to_owned(),
            ..self.clone()
        }
    }

    /// The account id.
    #[must_use]
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The queue the bare name `bare` names in the request's region: `bare` itself in the
    /// node's own region, `bare@region` in another.
    ///
    /// # Errors
    /// The core's refusal of an illegal bare name or region.
    pub fn scoped(&self, bare: &str) -> Result<QueueName, Reject> {
        QueueName::scoped(bare, self.away_region())
    }

    /// Whether `name` is a queue of the request's region (listings show only those).
    #[must_use]
    pub fn in_region(&self, name: &QueueName) -> bool {
        name.region() == self.away_region()
    }

    /// The request's region when it is not the node's own.
    fn away_region(&self) -> Option<&str> {
        (self.region != self.home_region).then_some(self.region.as_str())
    }

    /// The URL of queue `name`: its bare name under this endpoint and account (URLs carry no
    /// region, as SQS's are read by any of its regional hosts).
    #[must_use]
    pub fn queue_url(&self, name: &QueueName) -> String {
        format!("{}/{}/{}", self.base_url, self.account, name.bare())
    }

    /// The ARN of queue `name`, in the region it lives in.
    #[must_use]
    pub fn queue_arn(&self, name: &QueueName) -> String {
        let region = name.region().unwrap_or(&self.home_region);
        format!("arn:aws:sqs:{region}:{}:{}", self.account, name.bare())
    }

    /// The queue name in a queue URL, or a bare queue name. Any scheme and host are accepted
    /// (`sqs.<region>.<host>` among them); the path must be `/<account>/<name>` with this
    /// endpoint's account (a trailing slash is tolerated).
    ///
    /// # Errors
    /// `Malformed` for anything else, `Foreign` for another account.
    pub fn name_from_url<'a>(&self, url: &'a str) -> Result<&'a str, AddressError> {
        let malformed = || AddressError::Malformed {
            text: url.to_owned(),
        };
        let path = match url.find("://") {
            Some(scheme_end) => {
                let after_scheme = &url[scheme_end + 3..];
                &after_scheme[after_scheme.find('/').ok_or_else(malformed)?..]
            }
            None if url.starts_with('/') => url,
            // A bare queue name, which SQS accepts where a queue URL is expected.
            None if !url.is_empty() && !url.contains(['/', '?', '#']) => return Ok(url),
            None => return Err(malformed()),
        };
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let mut segments = path.trim_matches('/').split('/');
        let (Some(account), Some(name), None) = (segments.next(), segments.next(), segments.next())
        else {
            return Err(malformed());
        };
        if account.is_empty() || name.is_empty() {
            return Err(malformed());
        }
        if account != self.account {
            return Err(AddressError::Foreign {
                text: url.to_owned(),
            });
        }
        Ok(name)
    }

    /// The bare queue name in a queue ARN of the request's region and this endpoint's account.
    ///
    /// # Errors
    /// `Malformed` for text that is not `arn:<partition>:sqs:<region>:<account>:<name>`,
    /// `Foreign` for another region or account.
    pub fn name_from_arn<'a>(&self, arn: &'a str) -> Result<&'a str, AddressError> {
        let parts: Vec<&str> = arn.split(':').collect();
        let [prefix, partition, service, region, account, name] = parts.as_slice() else {
            return Err(AddressError::Malformed {
                text: arn.to_owned(),
            });
        };
        if *prefix != "arn" || partition.is_empty() || *service != "sqs" || name.is_empty() {
            return Err(AddressError::Malformed {
                text: arn.to_owned(),
            });
        }
        if *region != self.region || *account != self.account {
            return Err(AddressError::Foreign {
                text: arn.to_owned(),
            });
        }
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses() -> Addresses {
        Addresses::new("sqs.local", 9324, "000000000000", "us-east-1")
    }

    fn name(text: &str) -> QueueName {
        QueueName::try_from(text).unwrap()
    }

    #[test]
    fn url_and_arn_carry_host_port_account_region() {
        let a = addresses();
        assert_eq!(
            a.queue_url(&name("jobs")),
            "http://sqs.local:9324/000000000000/jobs"
        );
        assert_eq!(
            a.queue_arn(&name("jobs")),
            "arn:aws:sqs:us-east-1:000000000000:jobs"
        );
        let v6 = Addresses::new("::1", 9324, "1", "r");
        assert_eq!(v6.queue_url(&name("q")), "http://[::1]:9324/1/q");
    }

    #[test]
    fn url_round_trips_and_any_host_is_accepted() {
        let a = addresses();
        assert_eq!(a.name_from_url(&a.queue_url(&name("jobs"))), Ok("jobs"));
        assert_eq!(
            a.name_from_url("https://sqs.us-east-1.amazonaws.com/000000000000/jobs/"),
            Ok("jobs")
        );
        assert_eq!(a.name_from_url("/000000000000/jobs"), Ok("jobs"));
    }

    #[test]
    fn url_of_another_account_is_foreign_and_junk_is_malformed() {
        let a = addresses();
        assert!(matches!(
            a.name_from_url("http://h/123456789012/jobs"),
            Err(AddressError::Foreign { .. })
        ));
        assert_eq!(a.name_from_url("jobs"), Ok("jobs"));
        assert_eq!(
            a.name_from_url("http://sqs.us-east-1.localhost:9324/000000000000/jobs"),
            Ok("jobs")
        );
        for junk in [
            "",
            "http://h",
            "http://h/",
            "http://h/000000000000",
            "http://h/a/b/c",
        ] {
            assert!(
                matches!(a.name_from_url(junk), Err(AddressError::Malformed { .. })),
                "{junk}"
            );
        }
    }

    #[test]
    fn arn_round_trips_and_checks_region_and_account() {
        let a = addresses();
        assert_eq!(a.name_from_arn(&a.queue_arn(&name("dlq"))), Ok("dlq"));
        assert!(matches!(
            a.name_from_arn("arn:aws:sqs:eu-west-1:000000000000:dlq"),
            Err(AddressError::Foreign { .. })
        ));
        assert!(matches!(
            a.name_from_arn("arn:aws:sqs:us-east-1:111111111111:dlq"),
            Err(AddressError::Foreign { .. })
        ));
        for junk in [
            "dlq",
            "arn:aws:sns:us-east-1:000000000000:dlq",
            "arn:aws:sqs:us-east-1:000000000000:",
        ] {
            assert!(
                matches!(a.name_from_arn(junk), Err(AddressError::Malformed { .. })),
                "{junk}"
            );
        }
    }

    #[test]
    fn a_request_of_another_region_names_that_regions_queues() {
        let home = addresses();
        let away = home.for_region("eu-west-1");
        assert_eq!(home.scoped("jobs").unwrap(), name("jobs"));
        assert_eq!(away.scoped("jobs").unwrap(), name("jobs@eu-west-1"));
        assert_eq!(
            home.for_region("us-east-1").scoped("jobs").unwrap(),
            name("jobs")
        );
        assert!(home.in_region(&name("jobs")) && !home.in_region(&name("jobs@eu-west-1")));
        assert!(away.in_region(&name("jobs@eu-west-1")) && !away.in_region(&name("jobs")));
        assert!(!away.in_region(&name("jobs@eu-west-2")));
        // URLs carry the bare name; ARNs the queue's own region.
        let scoped = name("jobs@eu-west-1");
        assert_eq!(
            away.queue_url(&scoped),
            "http://sqs.local:9324/000000000000/jobs"
        );
        assert_eq!(
            away.queue_arn(&scoped),
            "arn:aws:sqs:eu-west-1:000000000000:jobs"
        );
        assert_eq!(away.name_from_arn(&away.queue_arn(&scoped)), Ok("jobs"));
        assert!(matches!(
            away.name_from_arn(&home.queue_arn(&name("jobs"))),
            Err(AddressError::Foreign { .. })
        ));
    }
}
