//! `trireme-node certs`: a cluster CA and one certificate per member for mutual TLS on the peer
//! port (`cluster::tls`). Each member's certificate names `node-N.trireme`, the name its peers
//! check against the node id it claims, besides the host names it is reached by; it is valid
//! for both ends of a connection (server and client authentication).
//!
//! The files, in one directory: `ca.pem` (the CA's certificate, given to every member),
//! `ca-key.pem` (the CA's key: only to sign more certificates; keep it off the members),
//! `node-N.pem` and `node-N-key.pem` (member N's certificate and key). Keys are written with
//! mode 0600. No file is ever overwritten, and `ca.pem` is written last, so a directory that
//! holds it holds a complete set.
//!
//! This module writes files only in the directory it is given and opens no socket.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use thiserror::Error;
use tokio_rustls::rustls::pki_types::ServerName;
use trireme_replication::NodeId;

use crate::cluster::tls::member_name;
use crate::config::{CertsArgs, PeerTlsFiles};
use crate::limits;

/// The CA's certificate in a certificate directory.
pub const CA_FILE_NAME: &str = "ca.pem";
/// The CA's private key in a certificate directory.
pub const CA_KEY_FILE_NAME: &str = "ca-key.pem";
/// Names every member's certificate is valid for, besides `node-N.trireme` and `nodeN`: the
/// loopback names of a cluster on one machine.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
/// A certificate is valid from this long before it is made, so a member whose clock is a little
/// behind the machine that made it accepts it.
const BACKDATE: time::Duration = time::Duration::hours(1);

/// Why certificates could not be made.
#[derive(Debug, Error)]
pub enum CertsError {
    /// The directory already holds a file this would write.
    #[error(
        "{path} exists: certificates are never overwritten (remove the directory's files, or \
         choose another directory)"
    )]
    Exists { path: String },
    /// A file or the directory could not be written.
    #[error("cannot write {path}: {reason}")]
    Io { path: String, reason: String },
    /// A member count out of range.
    #[error("--nodes {nodes}: a cluster has 1 to {max} members", max = limits::cluster_members_max)]
    Nodes { nodes: u16 },
    /// A `--host` entry that is not `N=NAME` for a member made here.
    #[error("--host {entry:?}: {reason}")]
    Host { entry: String, reason: String },
    /// Validity out of range.
    #[error("--days {days}: at least 1 is required")]
    Days { days: u32 },
    /// rcgen refused the parameters (e.g. a name that is not a valid DNS name).
    #[error("cannot make the certificate of {what}: {reason}")]
    Generate { what: String, reason: String },
}

/// What [`make`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The files it wrote, the CA's last.
    Made(Vec<PathBuf>),
    /// The directory already held a CA and `keep_existing` was asked for: nothing written.
    Kept,
}

/// Member `node`'s files in the certificate directory `dir`, as `--peer-tls-*` take them.
#[must_use]
pub fn member_files(dir: &Path, node: NodeId) -> PeerTlsFiles {
    PeerTlsFiles {
        ca: dir.join(CA_FILE_NAME),
        cert: dir.join(format!("node-{}.pem", node.0)),
        key: dir.join(format!("node-{}-key.pem", node.0)),
    }
}

/// Makes the CA and the members' certificates `args` asks for in `args.out`.
///
/// # Errors
/// [`CertsError`]: a setting out of range, a file that exists already, a file that cannot be
/// written, or a name rcgen refuses.
pub fn make(args: &CertsArgs) -> Result<Outcome, CertsError> {
    if args.nodes == 0 || usize::from(args.nodes) > limits::cluster_members_max {
        return Err(CertsError::Nodes { nodes: args.nodes });
    }
    if args.days == 0 {
        return Err(CertsError::Days { days: args.days });
    }
    let hosts = extra_hosts(&args.hosts, args.nodes)?;
    let dir = args.out.as_path();
    let ca_path = dir.join(CA_FILE_NAME);
    if ca_path.exists() {
        if args.keep_existing {
            return Ok(Outcome::Kept);
        }
        return Err(CertsError::Exists {
            path: ca_path.display().to_string(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|error| io_error(dir, &error))?;

    let now = time::OffsetDateTime::now_utc();
    let not_before = now - BACKDATE;
    let not_after = now + time::Duration::days(i64::from(args.days));
    let generate = |what: &str| {
        let what = what.to_owned();
        move |error: rcgen::Error| CertsError::Generate {
            what: what.clone(),
            reason: error.to_string(),
        }
    };

    let ca_key = KeyPair::generate().map_err(generate("the CA"))?;
    let mut ca_params = CertificateParams::default();
    // A name of its own per CA: a certificate of another cluster's CA is then refused as
    // from an unknown issuer, not as a bad signature of an issuer with the same name.
    let ca_id: u64 = rand::random();
    ca_params.distinguished_name = name(&format!("Trireme cluster CA {ca_id:016x}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(generate("the CA"))?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut files = Vec::new();
    for id in 1..=args.nodes {
        let node = NodeId(id);
        let what = format!("node {id}");
        let key = KeyPair::generate().map_err(generate(&what))?;
        let mut names = vec![member_name(node), format!("node{id}")];
        let more = LOOPBACK_NAMES
            .iter()
            .map(|name| (*name).to_owned())
            .chain(hosts.get(&id).into_iter().flatten().cloned());
        for more in more {
            if !names.contains(&more) {
                names.push(more);
            }
        }
        let mut params = CertificateParams::new(names).map_err(generate(&what))?;
        params.distinguished_name = name(&member_name(node));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before;
        params.not_after = not_after;
        assert!(
            params.subject_alt_names.iter().any(
                |san| matches!(san, SanType::DnsName(dns) if dns.as_str() == member_name(node))
            ),
            "every member's certificate names its member"
        );
        let cert = params.signed_by(&key, &issuer).map_err(generate(&what))?;
        let paths = member_files(dir, node);
        write_new(&paths.cert, cert.pem().as_bytes(), 0o644)?;
        write_new(&paths.key, key.serialize_pem().as_bytes(), 0o600)?;
        files.extend([paths.cert, paths.key]);
    }
    let ca_key_path = dir.join(CA_KEY_FILE_NAME);
    write_new(&ca_key_path, issuer.key().serialize_pem().as_bytes(), 0o600)?;
    // Last: its presence says the set is complete (`keep_existing`).
    write_new(&ca_path, ca_cert.pem().as_bytes(), 0o644)?;
    files.extend([ca_key_path, ca_path]);
    Ok(Outcome::Made(files))
}

/// The `--host N=NAME` entries by member.
fn extra_hosts(entries: &[String], nodes: u16) -> Result<BTreeMap<u16, Vec<String>>, CertsError> {
    let mut hosts: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for entry in entries {
        let malformed = |reason: &str| CertsError::Host {
            entry: entry.clone(),
            reason: reason.to_owned(),
        };
        let (node, host) = entry
            .split_once('=')
            .ok_or_else(|| malformed("expected N=NAME"))?;
        let node: u16 = node
            .parse()
            .map_err(|_| malformed("the member is not a number"))?;
        if node == 0 || node > nodes {
            return Err(malformed(&format!(
                "no member {node}: certificates are made for nodes 1 to {nodes}"
            )));
        }
        // rustls's own parser: what it takes is what a peer or client can name a server by.
        if ServerName::try_from(host.to_owned()).is_err() {
            return Err(malformed("not a DNS name or an IP address"));
        }
        hosts.entry(node).or_default().push(host.to_owned());
    }
    Ok(hosts)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// Writes a file that must not exist yet, with `mode`, and syncs it.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertsError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::AlreadyExists => CertsError::Exists {
                path: path.display().to_string(),
            },
            _ => io_error(path, &error),
        })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|error| io_error(path, &error))
}

fn io_error(path: &Path, error: &std::io::Error) -> CertsError {
    CertsError::Io {
        path: path.display().to_string(),
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::server::ParsedCertificate;

    use super::*;

    fn args(out: &Path, hosts: &[&str]) -> CertsArgs {
        CertsArgs {
            out: out.to_owned(),
            nodes: 3,
            hosts: hosts.iter().map(|host| (*host).to_owned()).collect(),
            days: 30,
            keep_existing: false,
        }
    }

    fn valid_for(cert: &Path, name: &str) -> bool {
        let der = CertificateDer::from_pem_file(cert).unwrap();
        let parsed = ParsedCertificate::try_from(&der).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        tokio_rustls::rustls::client::verify_server_name(&parsed, &name).is_ok()
    }

    #[test]
    fn makes_a_ca_and_each_member_with_its_names_and_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let Outcome::Made(files) = make(&args(&out, &["2=queue.example"])).unwrap() else {
            panic!("a new directory gets certificates");
        };
        assert_eq!(files.len(), 3 * 2 + 2);
        assert_eq!(files.last(), Some(&out.join(CA_FILE_NAME)), "the CA last");
        for node in 1..=3 {
            let member = member_files(&out, NodeId(node));
            assert!(valid_for(&member.cert, &format!("node-{node}.trireme")));
            assert!(valid_for(&member.cert, &format!("node{node}")));
            assert!(valid_for(&member.cert, "localhost"));
            assert!(valid_for(&member.cert, "127.0.0.1"));
            assert!(!valid_for(
                &member.cert,
                &format!("node-{}.trireme", node % 3 + 1)
            ));
            assert_eq!(valid_for(&member.cert, "queue.example"), node == 2);
            let mode = std::fs::metadata(&member.key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "node {node}'s key");
        }
        let mode = std::fs::metadata(out.join(CA_KEY_FILE_NAME))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn an_existing_ca_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let first = args(dir.path(), &[]);
        make(&first).unwrap();
        let ca = std::fs::read(dir.path().join(CA_FILE_NAME)).unwrap();
        let error = make(&first).unwrap_err();
        assert!(matches!(error, CertsError::Exists { .. }), "{error}");
        let keep = CertsArgs {
            keep_existing: true,
            ..first
        };
        assert_eq!(make(&keep).unwrap(), Outcome::Kept);
        assert_eq!(std::fs::read(dir.path().join(CA_FILE_NAME)).unwrap(), ca);
        // A set left half-written (no CA yet) is refused too, file by file.
        std::fs::remove_file(dir.path().join(CA_FILE_NAME)).unwrap();
        let error = make(&keep).unwrap_err();
        assert!(
            matches!(&error, CertsError::Exists { path } if path.ends_with("node-1.pem")),
            "{error}"
        );
    }

    #[test]
    fn bad_settings_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        for (hosts, nodes, days) in [
            (&["4=n4"][..], 3, 30),
            (&["0=n0"][..], 3, 30),
            (&["x=n"][..], 3, 30),
            (&["1"][..], 3, 30),
            (&["1="][..], 3, 30),
            (&[][..], 0, 30),
            (&[][..], 65, 30),
            (&[][..], 3, 0),
        ] {
            let args = CertsArgs {
                nodes,
                days,
                ..args(&out, hosts)
            };
            let error = make(&args).unwrap_err();
            assert!(
                matches!(
                    error,
                    CertsError::Host { .. } | CertsError::Nodes { .. } | CertsError::Days { .. }
                ),
                "{hosts:?} {nodes} {days}: {error}"
            );
            assert!(!out.exists());
        }
        let error = make(&args(&out, &["1=not a name"])).unwrap_err();
        assert!(matches!(error, CertsError::Host { .. }), "{error}");
        assert!(!out.exists());
    }
}
