//! The node's configuration: command-line flags (each with an environment variable) over an
//! optional TOML file over built-in defaults. Parsing and checking happen here, once, before
//! anything starts; the rest of the node reads a finished [`Config`].
//!
//! This module must never open sockets or files other than the configuration file itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};
use serde::Deserialize;
use thiserror::Error;

use crate::handle::HANDLE_KEY_BYTES_MIN;
use crate::limits;

/// Default gRPC listen address.
pub const LISTEN_DEFAULT: &str = "0.0.0.0:7100";
/// Default SQS-compatible endpoint address (the port local SQS emulators use).
pub const SQS_LISTEN_DEFAULT: &str = "0.0.0.0:9324";
/// Default host name in SQS queue URLs.
pub const SQS_ADVERTISED_HOST_DEFAULT: &str = "localhost";
/// Default region in SQS queue ARNs.
pub const SQS_REGION_DEFAULT: &str = "us-east-1";
/// Default account id in SQS queue URLs and ARNs.
pub const SQS_ACCOUNT_ID_DEFAULT: &str = "000000000000";
/// Default data directory, relative to the working directory.
pub const DATA_DIR_DEFAULT: &str = "./trireme-data";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

/// `trireme-node`: a Trireme queue server. Every flag can also be set by the environment
/// variable shown, or by the same key (with `_` for `-`) in the `--config` TOML file. A flag or
/// variable beats the file; the file beats the default.
#[derive(Debug, Default, Parser)]
#[command(name = "trireme-node", version, about, long_about = None)]
pub struct Args {
    /// TOML file with any of the settings below (keys like `data_dir`, `listen`).
    #[arg(long, env = "TRIREME_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory holding the database (`trireme.redb`); created if missing.
    /// [default: ./trireme-data]
    #[arg(long, env = "TRIREME_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Address the gRPC API listens on. Port 0 picks a free port; the chosen address is printed.
    /// [default: 0.0.0.0:7100]
    #[arg(long, env = "TRIREME_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Address the SQS-compatible HTTP endpoint listens on. [default: 0.0.0.0:9324]
    #[arg(long, env = "TRIREME_SQS_LISTEN", value_name = "ADDR")]
    pub sqs_listen: Option<SocketAddr>,

    /// Do not serve the SQS-compatible endpoint.
    #[arg(long, env = "TRIREME_NO_SQS")]
    pub no_sqs: bool,

    /// Host name put in SQS queue URLs (what clients use to reach this node).
    /// [default: localhost]
    #[arg(long, env = "TRIREME_SQS_ADVERTISED_HOST", value_name = "HOST")]
    pub sqs_advertised_host: Option<String>,

    /// Port put in SQS queue URLs. [default: the port the SQS endpoint listens on]
    #[arg(long, env = "TRIREME_SQS_ADVERTISED_PORT", value_name = "PORT")]
    pub sqs_advertised_port: Option<u16>,

    /// Region in SQS queue ARNs. [default: us-east-1]
    #[arg(long, env = "TRIREME_SQS_REGION", value_name = "REGION")]
    pub sqs_region: Option<String>,

    /// Account id in SQS queue URLs and ARNs. [default: 000000000000]
    #[arg(long, env = "TRIREME_SQS_ACCOUNT_ID", value_name = "ID")]
    pub sqs_account_id: Option<String>,

    /// SigV4 access keys accepted by the SQS endpoint, as `ID:SECRET`, comma-separated or
    /// repeated. None: requests are not authenticated, as local SQS emulators do.
    #[arg(
        long = "sqs-access-key",
        env = "TRIREME_SQS_ACCESS_KEYS",
        value_name = "ID:SECRET",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub sqs_access_keys: Vec<String>,

    /// Key authenticating receipt handles (at least 16 bytes), shared by all nodes of a
    /// cluster. Unset: a random key is generated once and kept in the database.
    #[arg(
        long,
        env = "TRIREME_HANDLE_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub handle_key: Option<String>,

    /// Seed of the node's random source (message ids, receipt-handle keys it generates).
    /// Unset: seeded from the operating system. Set it only for reproducible tests.
    #[arg(long, env = "TRIREME_SEED", value_name = "U64")]
    pub seed: Option<u64>,

    /// redb page cache in MiB. [default: 64]
    #[arg(long, env = "TRIREME_DB_CACHE_MIB", value_name = "MIB")]
    pub db_cache_mib: Option<usize>,

    /// Largest gRPC request decoded, in bytes. [default: 2097152]
    #[arg(long, env = "TRIREME_GRPC_REQUEST_BYTES_MAX", value_name = "BYTES")]
    pub grpc_request_bytes_max: Option<usize>,

    /// Largest gRPC response encoded, in bytes. [default: 12582912]
    #[arg(long, env = "TRIREME_GRPC_RESPONSE_BYTES_MAX", value_name = "BYTES")]
    pub grpc_response_bytes_max: Option<usize>,

    /// Seconds before an unfinished request is cancelled; must exceed the 20 s long poll.
    /// [default: 60]
    #[arg(long, env = "TRIREME_REQUEST_TIMEOUT_S", value_name = "SECONDS")]
    pub request_timeout_s: Option<u64>,

    /// Open long polls (receives waiting for a message) allowed at once. [default: 10000]
    #[arg(long, env = "TRIREME_LONG_POLLS_MAX", value_name = "COUNT")]
    pub long_polls_max: Option<usize>,

    /// Commands applied per group commit (one fsync). [default: 1024]
    #[arg(long, env = "TRIREME_COMMIT_BATCH_COMMANDS_MAX", value_name = "COUNT")]
    pub commit_batch_commands_max: Option<usize>,

    /// Commands queued for the engine before callers wait. [default: 4096]
    #[arg(long, env = "TRIREME_ENGINE_QUEUE_COMMANDS_MAX", value_name = "COUNT")]
    pub engine_queue_commands_max: Option<usize>,

    /// Seconds shutdown waits for open requests after answering long polls. [default: 10]
    #[arg(long, env = "TRIREME_SHUTDOWN_GRACE_S", value_name = "SECONDS")]
    pub shutdown_grace_s: Option<u64>,

    /// Log filter in `tracing` syntax, e.g. `info` or `trireme_node=debug`. [default: info]
    #[arg(long, env = "TRIREME_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    /// Log line format. [default: text]
    #[arg(long, env = "TRIREME_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

/// The TOML file: the same settings as the flags, all optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    sqs_listen: Option<SocketAddr>,
    no_sqs: Option<bool>,
    sqs_advertised_host: Option<String>,
    sqs_advertised_port: Option<u16>,
    sqs_region: Option<String>,
    sqs_account_id: Option<String>,
    sqs_access_keys: Option<Vec<String>>,
    handle_key: Option<String>,
    seed: Option<u64>,
    db_cache_mib: Option<usize>,
    grpc_request_bytes_max: Option<usize>,
    grpc_response_bytes_max: Option<usize>,
    request_timeout_s: Option<u64>,
    long_polls_max: Option<usize>,
    commit_batch_commands_max: Option<usize>,
    engine_queue_commands_max: Option<usize>,
    shutdown_grace_s: Option<u64>,
    log: Option<String>,
    log_format: Option<LogFormat>,
}

/// A configuration that was refused, naming the setting.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {path}: {reason}")]
    FileUnreadable { path: String, reason: String },
    /// The configuration file is not valid TOML or has an unknown key.
    #[error("configuration file {path} is invalid: {reason}")]
    FileInvalid { path: String, reason: String },
    /// A setting is out of its range.
    #[error("setting {setting}: {reason}")]
    Invalid {
        setting: &'static str,
        reason: String,
    },
}

/// The finished configuration of one node.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the database lives.
    pub data_dir: PathBuf,
    /// The gRPC listen address (the caller binds it; tests pass their own listener).
    pub listen: SocketAddr,
    /// The SQS endpoint's listen address and settings; `None` when it is turned off.
    pub sqs: Option<SqsConfig>,
    /// The receipt-handle key given by the operator; `None` means the database's own key.
    pub handle_key: Option<Vec<u8>>,
    /// Seed of the node's random source; `None` seeds from the operating system.
    pub seed: Option<u64>,
    /// redb page cache in bytes.
    pub db_cache_bytes: usize,
    /// Largest gRPC request decoded.
    pub grpc_request_bytes_max: usize,
    /// Largest gRPC response encoded.
    pub grpc_response_bytes_max: usize,
    /// Seconds before an unfinished request is cancelled.
    pub request_timeout_s: u64,
    /// Open long polls allowed at once.
    pub long_polls_max: usize,
    /// Commands per group commit.
    pub commit_batch_commands_max: usize,
    /// Commands queued for the engine.
    pub engine_queue_commands_max: usize,
    /// Seconds shutdown waits for open requests.
    pub shutdown_grace_s: u64,
    /// Log filter.
    pub log: String,
    /// Log format.
    pub log_format: LogFormat,
}

/// The SQS-compatible endpoint's settings.
#[derive(Clone, Debug)]
pub struct SqsConfig {
    /// The listen address (the caller binds it).
    pub listen: SocketAddr,
    /// Host name in queue URLs.
    pub advertised_host: String,
    /// Port in queue URLs; `None`: the bound port.
    pub advertised_port: Option<u16>,
    /// Region in queue ARNs.
    pub region: String,
    /// Account id in queue URLs and ARNs.
    pub account_id: String,
    /// Accepted SigV4 keys as `(id, secret)`; empty: no authentication.
    pub access_keys: Vec<(String, String)>,
}

impl Config {
    /// The defaults, with the database in `data_dir`. Used by tests and embedders.
    #[must_use]
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Config {
        Config::resolve(Args::default(), FileConfig::default())
            .map(|mut config| {
                config.data_dir = data_dir.into();
                config
            })
            .expect("the defaults are valid")
    }

    /// Reads the file named by `args.config` (if any) and merges it under the flags.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file or the setting that is wrong.
    pub fn load(args: Args) -> Result<Config, ConfigError> {
        let file = match &args.config {
            None => FileConfig::default(),
            Some(path) => read_file(path)?,
        };
        Config::resolve(args, file)
    }

    fn resolve(args: Args, file: FileConfig) -> Result<Config, ConfigError> {
        let handle_key = args.handle_key.or(file.handle_key).map(String::into_bytes);
        if let Some(key) = &handle_key
            && key.len() < HANDLE_KEY_BYTES_MIN
        {
            return Err(ConfigError::Invalid {
                setting: "handle_key",
                reason: format!(
                    "is {} bytes, at least {HANDLE_KEY_BYTES_MIN} are required",
                    key.len()
                ),
            });
        }
        let no_sqs = args.no_sqs || file.no_sqs.unwrap_or(false);
        let sqs = if no_sqs {
            None
        } else {
            let keys = if args.sqs_access_keys.is_empty() {
                file.sqs_access_keys.unwrap_or_default()
            } else {
                args.sqs_access_keys
            };
            let access_keys = keys
                .iter()
                .map(|pair| {
                    pair.split_once(':')
                        .filter(|(id, secret)| !id.is_empty() && !secret.is_empty())
                        .map(|(id, secret)| (id.to_owned(), secret.to_owned()))
                        .ok_or_else(|| ConfigError::Invalid {
                            setting: "sqs_access_keys",
                            reason: "each key must be ID:SECRET with both parts non-empty"
                                .to_owned(),
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some(SqsConfig {
                listen: args.sqs_listen.or(file.sqs_listen).unwrap_or_else(|| {
                    SQS_LISTEN_DEFAULT.parse().expect("a valid literal address")
                }),
                advertised_host: args
                    .sqs_advertised_host
                    .or(file.sqs_advertised_host)
                    .unwrap_or_else(|| SQS_ADVERTISED_HOST_DEFAULT.to_owned()),
                advertised_port: args.sqs_advertised_port.or(file.sqs_advertised_port),
                region: args
                    .sqs_region
                    .or(file.sqs_region)
                    .unwrap_or_else(|| SQS_REGION_DEFAULT.to_owned()),
                account_id: args
                    .sqs_account_id
                    .or(file.sqs_account_id)
                    .unwrap_or_else(|| SQS_ACCOUNT_ID_DEFAULT.to_owned()),
                access_keys,
            })
        };
        let config = Config {
            sqs,
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from(DATA_DIR_DEFAULT)),
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| LISTEN_DEFAULT.parse().expect("a valid literal address")),
            handle_key,
            seed: args.seed.or(file.seed),
            db_cache_bytes: args
                .db_cache_mib
                .or(file.db_cache_mib)
                .unwrap_or(limits::db_cache_mib_default)
                .saturating_mul(1024 * 1024),
            grpc_request_bytes_max: args
                .grpc_request_bytes_max
                .or(file.grpc_request_bytes_max)
                .unwrap_or(limits::grpc_request_bytes_max_default),
            grpc_response_bytes_max: args
                .grpc_response_bytes_max
                .or(file.grpc_response_bytes_max)
                .unwrap_or(limits::grpc_response_bytes_max_default),
            request_timeout_s: args
                .request_timeout_s
                .or(file.request_timeout_s)
                .unwrap_or(limits::request_timeout_s_default),
            long_polls_max: args
                .long_polls_max
                .or(file.long_polls_max)
                .unwrap_or(limits::long_polls_max_default),
            commit_batch_commands_max: args
                .commit_batch_commands_max
                .or(file.commit_batch_commands_max)
                .unwrap_or(limits::commit_batch_commands_max_default),
            engine_queue_commands_max: args
                .engine_queue_commands_max
                .or(file.engine_queue_commands_max)
                .unwrap_or(limits::engine_queue_commands_max_default),
            shutdown_grace_s: args
                .shutdown_grace_s
                .or(file.shutdown_grace_s)
                .unwrap_or(limits::shutdown_grace_s_default),
            log: args.log.or(file.log).unwrap_or_else(|| "info".to_owned()),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let at_least = |setting: &'static str, value: u64, min: u64| {
            if value < min {
                Err(ConfigError::Invalid {
                    setting,
                    reason: format!("is {value}, at least {min} is required"),
                })
            } else {
                Ok(())
            }
        };
        let wait_s_max = u64::from(trireme_core::limits::wait_s_max);
        at_least("request_timeout_s", self.request_timeout_s, wait_s_max + 5)?;
        at_least("db_cache_mib", self.db_cache_bytes as u64, 1024 * 1024)?;
        // A request must fit a full send batch; a response a full receive.
        at_least(
            "grpc_request_bytes_max",
            self.grpc_request_bytes_max as u64,
            limits::batch_payload_bytes_max + 64 * 1024,
        )?;
        at_least(
            "grpc_response_bytes_max",
            self.grpc_response_bytes_max as u64,
            u64::from(trireme_core::limits::batch_entries_max)
                * u64::from(trireme_core::limits::message_bytes_max)
                + 256 * 1024,
        )?;
        at_least("long_polls_max", self.long_polls_max as u64, 1)?;
        at_least(
            "commit_batch_commands_max",
            self.commit_batch_commands_max as u64,
            1,
        )?;
        at_least(
            "engine_queue_commands_max",
            self.engine_queue_commands_max as u64,
            self.commit_batch_commands_max as u64,
        )?;
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::FileUnreadable {
        path: path.display().to_string(),
        reason: error.to_string(),
    })?;
    toml::from_str(&text).map_err(|error| ConfigError::FileInvalid {
        path: path.display().to_string(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Args {
        let mut argv = vec!["trireme-node"];
        argv.extend_from_slice(flags);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn defaults_listen_on_7100_with_a_local_data_dir() {
        let config = Config::resolve(Args::default(), FileConfig::default()).unwrap();
        assert_eq!(config.listen.port(), 7100);
        assert_eq!(config.data_dir, PathBuf::from(DATA_DIR_DEFAULT));
        assert_eq!(config.handle_key, None);
        assert_eq!(config.db_cache_bytes, 64 * 1024 * 1024);
        let sqs = config.sqs.unwrap();
        assert_eq!(sqs.listen.port(), 9324);
        assert!(sqs.access_keys.is_empty());
    }

    #[test]
    fn sqs_access_keys_split_on_comma_and_colon_and_no_sqs_turns_it_off() {
        let config = Config::load(parse(&["--sqs-access-key", "AKID:secret,other:s2"])).unwrap();
        assert_eq!(
            config.sqs.unwrap().access_keys,
            vec![
                ("AKID".to_owned(), "secret".to_owned()),
                ("other".to_owned(), "s2".to_owned())
            ]
        );
        let error = Config::load(parse(&["--sqs-access-key", "no-secret"])).unwrap_err();
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "sqs_access_keys",
                ..
            }
        ));
        assert!(Config::load(parse(&["--no-sqs"])).unwrap().sqs.is_none());
    }

    #[test]
    fn flag_beats_file_and_file_beats_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "data_dir = \"/from/file\"\nlisten = \"127.0.0.1:9000\"\nlong_polls_max = 5\n",
        )
        .unwrap();
        let args = parse(&[
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7200",
        ]);
        let config = Config::load(args).unwrap();
        assert_eq!(config.listen, "127.0.0.1:7200".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("/from/file"));
        assert_eq!(config.long_polls_max, 5);
        assert_eq!(
            config.commit_batch_commands_max,
            limits::commit_batch_commands_max_default
        );
    }

    #[test]
    fn unknown_file_key_is_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "listen_port = 7100\n").unwrap();
        let error = Config::load(parse(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(matches!(error, ConfigError::FileInvalid { .. }), "{error}");
        assert!(error.to_string().contains("listen_port"), "{error}");
    }

    #[test]
    fn short_handle_key_and_short_request_timeout_are_refused() {
        let error = Config::load(parse(&["--handle-key", "short"])).unwrap_err();
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "handle_key",
                ..
            }
        ));
        let error = Config::load(parse(&["--request-timeout-s", "20"])).unwrap_err();
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "request_timeout_s",
                ..
            }
        ));
    }
}
