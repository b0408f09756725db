//! TLS to the database: libpq's `sslmode` and `sslrootcert`, given their libpq meaning, and the
//! rustls connector every pooled connection is opened with.
//!
//! | `sslmode` | TLS | certificate check |
//! |---|---|---|
//! | `disable` | never | none |
//! | `prefer` (default) | if the server offers it, else plaintext | none |
//! | `require` | always | none; but as in libpq, with a root certificate (`sslrootcert`, or libpq's default file) the chain is checked as under `verify-ca` |
//! | `verify-ca` | always | the chain must lead to a trusted CA; the host name is not checked |
//! | `verify-full` | always | the chain, and the host name (DNS name or IP address) against the certificate's names |
//!
//! The trusted CAs (`verify-ca`, `verify-full`): `sslrootcert=PATH`, a PEM file of one or more
//! certificates; without it libpq's default `~/.postgresql/root.crt` (`$HOME`), and an error if that
//! does not exist either, as with libpq; `sslrootcert=system` takes the system's trusted roots (the
//! files OpenSSL would read, `SSL_CERT_FILE`/`SSL_CERT_DIR` honoured) and, as in libpq, then requires
//! `verify-full` and makes it the default. The `PGSSLMODE`/`PGSSLROOTCERT` environment variables are
//! not read: the URL says everything (tokio-postgres reads no `PG*` variable either). A rejected
//! certificate is a [`PgError::Certificate`] naming the host and the reason, at start-up, without
//! retries.
//!
//! # Why rustls (with tokio-postgres-rustls) and not native-tls
//!
//! - It is Rust and builds with cargo alone on every machine and in CI. native-tls on Linux links
//!   the system's OpenSSL: its headers and pkg-config at build time, and the binary then depends on
//!   the libssl of the machine it runs on. Its behaviour also differs per platform (OpenSSL,
//!   SChannel, Security.framework).
//! - Its verification errors are typed (`UnknownIssuer`, `NotValidForNameContext` with the names
//!   the certificate holds), so start-up can say exactly why a certificate was rejected instead of
//!   relaying a platform's message.
//! - libpq's modes map onto one small [`ServerCertVerifier`] built from rustls's own public
//!   verification functions (chain, then name), so `verify-ca` (chain without name) is not an
//!   all-or-nothing "accept invalid host names" switch.
//! - tokio-postgres-rustls is the maintained adapter for tokio-postgres and supports SCRAM channel
//!   binding (`tls-server-end-point`).
//!
//! The crypto provider is `ring`, passed explicitly: it builds with a C compiler only, whereas
//! rustls's default `aws-lc-rs` needs cmake, and an explicit provider does not depend on (or panic
//! over) a process-wide default that another crate might install.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as TlsError, OtherError,
    RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::{CertProblem, PgError};
use super::ssl_params::SslParams;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow (plaintext first) is not supported: use prefer or disable"
                        .into(),
                );
            }
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                ));
            }
        })
    }

    /// The name libpq gives it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether TLS is tried, and whether it is required.
    fn driver_mode(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// How connections are opened: tokio-postgres's mode and the connector (used unless `Disable`).
pub(crate) struct Tls {
    pub(crate) mode: SslMode,
    pub(crate) driver_mode: tokio_postgres::config::SslMode,
    pub(crate) connector: MakeRustlsConnect,
}

/// The TLS set-up for `params` (from [`super::ssl_params::split`]). `url` is the redacted URL, for
/// error messages. Reads the root certificate file now, so a missing or bad one fails start-up
/// before any connection is tried.
pub(crate) fn setup(params: &SslParams, url: &str) -> Result<Tls, PgError> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    setup_with_home(params, url, home.as_deref())
}

fn setup_with_home(params: &SslParams, url: &str, home: Option<&Path>) -> Result<Tls, PgError> {
    let system = params.sslrootcert.as_deref() == Some("system");
    let mode = match params.sslmode.as_deref() {
        Some(value) => SslMode::parse(value).map_err(|reason| PgError::Url {
            url: url.to_string(),
            reason,
        })?,
        // libpq: sslrootcert=system makes verify-full the default.
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(PgError::Url {
            url: url.to_string(),
            reason: "sslrootcert=system needs sslmode=verify-full (as in libpq): \
                     the system's roots trust any public CA, so the host name must be checked too"
                .into(),
        });
    }
    let roots = match trusted_roots(mode, params.sslrootcert.as_deref(), home) {
        Ok(roots) => roots,
        Err((path, reason)) => {
            return Err(PgError::RootCert {
                url: url.to_string(),
                path,
                reason,
            });
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Verifier {
        roots: roots.map(|(store, from)| (Arc::new(store), from)),
        check_name: mode == SslMode::VerifyFull,
        algorithms: provider.signature_verification_algorithms,
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Config(format!("TLS set-up: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Tls {
        mode,
        driver_mode: mode.driver_mode(),
        connector: MakeRustlsConnect::new(config),
    })
}

/// libpq's default root certificate file: `~/.postgresql/root.crt`.
fn default_root_cert(home: Option<&Path>) -> Option<PathBuf> {
    home.map(|h| h.join(".postgresql").join("root.crt"))
}

/// The CAs that `mode` verifies against, with a description for messages; `None` when the
/// certificate is not checked. Errors: (the file, or `system`; what is wrong).
fn trusted_roots(
    mode: SslMode,
    sslrootcert: Option<&str>,
    home: Option<&Path>,
) -> Result<Option<(RootCertStore, String)>, (String, String)> {
    let verify = match mode {
        SslMode::Disable | SslMode::Prefer => return Ok(None),
        SslMode::Require => false,
        SslMode::VerifyCa | SslMode::VerifyFull => true,
    };
    if sslrootcert == Some("system") {
        return system_roots().map(Some);
    }
    let path = match sslrootcert {
        Some(path) => PathBuf::from(path),
        None => match default_root_cert(home) {
            // libpq: under require, a default root file that exists turns on the chain check.
            Some(path) if path.exists() => path,
            Some(path) if verify => {
                return Err((
                    path.display().to_string(),
                    missing_default(mode, "does not exist"),
                ));
            }
            None if verify => {
                return Err((
                    "~/.postgresql/root.crt".into(),
                    missing_default(mode, "cannot be found ($HOME is not set)"),
                ));
            }
            _ => return Ok(None),
        },
    };
    let store = load_pem_roots(&path).map_err(|reason| (path.display().to_string(), reason))?;
    Ok(Some((store, format!("sslrootcert {}", path.display()))))
}

fn missing_default(mode: SslMode, what: &str) -> String {
    let mode = mode.as_str();
    format!(
        "libpq's default root certificate file {what}, and sslmode={mode} needs the CA's \
         certificate: set sslrootcert=PATH (PEM) or sslrootcert=system"
    )
}

/// Every certificate in the PEM file at `path`, as trust anchors.
fn load_pem_roots(path: &Path) -> Result<RootCertStore, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| format!("not a PEM file: {e}"))?;
        store
            .add(cert)
            .map_err(|e| format!("a certificate in it is not usable as a CA: {e}"))?;
    }
    if store.is_empty() {
        return Err("it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(store)
}

fn system_roots() -> Result<(RootCertStore, String), (String, String)> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    store.add_parsable_certificates(found.certs);
    if store.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err((
            "system".into(),
            format!(
                "no trusted CA certificate found in the system's store (install the \
                 distribution's ca-certificates, or set SSL_CERT_FILE){}{}",
                if errors.is_empty() { "" } else { ": " },
                errors.join("; ")
            ),
        ));
    }
    Ok((
        store,
        "the system's trusted roots (sslrootcert=system)".into(),
    ))
}

/// A rejected server certificate: carried through rustls and tokio-postgres inside
/// `CertificateError::Other`, and found again by [`rejection`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("the TLS certificate of {host} is not accepted: {problem}")]
pub(crate) struct Rejected {
    pub(crate) host: String,
    pub(crate) problem: CertProblem,
}

/// The certificate check of one connection. Without roots it accepts any certificate (`prefer`,
/// `require`), but the handshake signatures are still verified with the certificate's key.
#[derive(Debug)]
struct Verifier {
    roots: Option<(Arc<RootCertStore>, String)>,
    check_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl Verifier {
    fn reject(host: &ServerName<'_>, problem: CertProblem) -> TlsError {
        TlsError::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(Rejected {
            host: host.to_str().into_owned(),
            problem,
        }))))
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let Some((roots, from)) = &self.roots else {
            return Ok(ServerCertVerified::assertion());
        };
        let cert = ParsedCertificate::try_from(end_entity)
            .map_err(|e| Self::reject(server_name, CertProblem::Invalid(e.to_string())))?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            intermediates,
            now,
            self.algorithms.all,
        )
        .map_err(|e| Self::reject(server_name, chain_problem(e, from)))?;
        if self.check_name {
            verify_server_name(&cert, server_name)
                .map_err(|e| Self::reject(server_name, name_problem(e)))?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Why the chain check failed. An unknown issuer, or an issuer of a trusted CA's name whose key did
/// not sign the certificate, both mean: not signed by a trusted CA.
fn chain_problem(e: TlsError, roots: &str) -> CertProblem {
    match e {
        TlsError::InvalidCertificate(CertificateError::UnknownIssuer)
        | TlsError::InvalidCertificate(CertificateError::BadSignature) => CertProblem::NotTrusted {
            roots: roots.to_string(),
        },
        other => CertProblem::Invalid(other.to_string()),
    }
}

fn name_problem(e: TlsError) -> CertProblem {
    match e {
        TlsError::InvalidCertificate(CertificateError::NotValidForNameContext {
            presented,
            ..
        }) => CertProblem::NameMismatch {
            presented: presented.into_iter().map(plain_name).collect(),
        },
        TlsError::InvalidCertificate(CertificateError::NotValidForName) => {
            CertProblem::NameMismatch {
                presented: Vec::new(),
            }
        }
        other => CertProblem::Invalid(other.to_string()),
    }
}

/// A name as webpki reports it (`DnsName("db.example")`, `IpAddress(10.0.0.5)`), without the
/// wrapping: `db.example`, `10.0.0.5`. Other kinds are kept as they are.
fn plain_name(name: String) -> String {
    let inner = name
        .strip_prefix("DnsName(\"")
        .and_then(|n| n.strip_suffix("\")"))
        .or_else(|| {
            name.strip_prefix("IpAddress(")
                .and_then(|n| n.strip_suffix(')'))
        });
    match inner {
        Some(inner) => inner.to_string(),
        None => name,
    }
}

/// The certificate rejection behind a failed connection, if that is why it failed.
pub(crate) fn rejection(e: &tokio_postgres::Error) -> Option<&Rejected> {
    find_rejection(std::error::Error::source(e))
}

/// Walks an error's causes for a [`Rejected`] (inside rustls's error, inside tokio-rustls's
/// `io::Error`).
fn find_rejection<'a>(
    mut next: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a Rejected> {
    while let Some(err) = next {
        if let Some(rejected) = err.downcast_ref::<Rejected>() {
            return Some(rejected);
        }
        if let Some(TlsError::InvalidCertificate(CertificateError::Other(OtherError(inner)))) =
            err.downcast_ref::<TlsError>()
            && let Some(rejected) = inner.downcast_ref::<Rejected>()
        {
            return Some(rejected);
        }
        // io::Error::source skips the error it wraps: look inside it.
        next = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: Option<&str>, root: Option<&str>) -> SslParams {
        SslParams {
            sslmode: mode.map(str::to_string),
            sslrootcert: root.map(str::to_string),
        }
    }

    fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("idemlog-tls-unit-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("temp file");
        path
    }

    #[test]
    fn the_default_mode_is_prefer_and_tries_tls_without_checking_the_certificate() {
        let tls = setup_with_home(&params(None, None), "u", None).expect("set-up");
        assert_eq!(tls.mode, SslMode::Prefer);
        assert_eq!(tls.driver_mode, tokio_postgres::config::SslMode::Prefer);
    }

    #[test]
    fn every_libpq_mode_is_accepted_and_the_verifying_ones_require_tls() {
        let ca = temp_file("mode-ca.pem", TEST_CA.as_bytes());
        let ca = ca.to_str().expect("utf-8 path");
        for (value, driver) in [
            ("disable", tokio_postgres::config::SslMode::Disable),
            ("prefer", tokio_postgres::config::SslMode::Prefer),
            ("require", tokio_postgres::config::SslMode::Require),
            ("verify-ca", tokio_postgres::config::SslMode::Require),
            ("verify-full", tokio_postgres::config::SslMode::Require),
        ] {
            let tls = setup_with_home(&params(Some(value), Some(ca)), "u", None)
                .unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(tls.driver_mode, driver, "{value}");
        }
    }

    #[test]
    fn an_unknown_sslmode_is_a_url_error_listing_the_modes() {
        for bad in ["verify_full", "allow", ""] {
            let err = setup_with_home(&params(Some(bad), None), "u", None)
                .err()
                .expect("rejected");
            assert!(matches!(err, PgError::Url { .. }), "{err}");
            assert!(err.to_string().contains("prefer"), "{err}");
        }
    }

    #[test]
    fn a_missing_sslrootcert_file_is_an_error_naming_the_path() {
        let err = setup_with_home(
            &params(Some("verify-full"), Some("/nonexistent/idemlog/ca.pem")),
            "u",
            None,
        )
        .err()
        .expect("rejected");
        match &err {
            PgError::RootCert { path, reason, .. } => {
                assert_eq!(path, "/nonexistent/idemlog/ca.pem");
                assert!(reason.contains("cannot read"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            err.to_string().contains("/nonexistent/idemlog/ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn a_sslrootcert_file_without_a_certificate_is_an_error_naming_the_path() {
        let path = temp_file("not-a-cert.pem", b"hello, not a certificate\n");
        let err = setup_with_home(
            &params(Some("verify-ca"), Some(path.to_str().expect("utf-8"))),
            "u",
            None,
        )
        .err()
        .expect("rejected");
        match &err {
            PgError::RootCert {
                path: p, reason, ..
            } => {
                assert_eq!(p, &path.display().to_string());
                assert!(reason.contains("no PEM certificate"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verify_full_without_sslrootcert_uses_libpqs_default_file_and_fails_naming_it_when_missing() {
        let home = std::env::temp_dir().join(format!("idemlog-tls-home-{}", std::process::id()));
        let err = setup_with_home(&params(Some("verify-full"), None), "u", Some(&home))
            .err()
            .expect("rejected");
        let expected = home.join(".postgresql/root.crt").display().to_string();
        match &err {
            PgError::RootCert { path, reason, .. } => {
                assert_eq!(path, &expected);
                assert!(reason.contains("sslrootcert="), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // With the file present, it is used.
        std::fs::create_dir_all(home.join(".postgresql")).expect("dir");
        std::fs::write(home.join(".postgresql/root.crt"), TEST_CA).expect("write");
        let tls = setup_with_home(&params(Some("verify-full"), None), "u", Some(&home));
        assert!(tls.is_ok(), "{:?}", tls.err());
        let (_, from) = trusted_roots(SslMode::Require, None, Some(&home))
            .expect("roots")
            .expect("require checks the chain when libpq's default file exists");
        assert!(from.contains(&expected), "{from}");
    }

    #[test]
    fn require_checks_nothing_without_a_root_certificate_and_the_chain_with_one() {
        let nowhere = Path::new("/nonexistent/idemlog-home");
        assert!(
            trusted_roots(SslMode::Require, None, Some(nowhere))
                .expect("ok")
                .is_none()
        );
        let ca = temp_file("require-ca.pem", TEST_CA.as_bytes());
        assert!(
            trusted_roots(SslMode::Require, ca.to_str(), Some(nowhere))
                .expect("ok")
                .is_some()
        );
        // prefer never checks, even with a CA file named.
        assert!(
            trusted_roots(SslMode::Prefer, ca.to_str(), Some(nowhere))
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn sslrootcert_system_defaults_to_verify_full_and_refuses_weaker_modes() {
        for weak in ["disable", "prefer", "require", "verify-ca"] {
            let err = setup_with_home(&params(Some(weak), Some("system")), "u", None)
                .err()
                .expect("rejected");
            assert!(err.to_string().contains("verify-full"), "{weak}: {err}");
        }
        // Without sslmode it means verify-full; whether it then succeeds depends on the machine's
        // store, so only the mode is checked when it does.
        if let Ok(tls) = setup_with_home(&params(None, Some("system")), "u", None) {
            assert_eq!(tls.mode, SslMode::VerifyFull);
        }
    }

    #[test]
    fn rejection_is_found_through_the_io_error_tokio_rustls_wraps_it_in() {
        let rejected = Verifier::reject(
            &ServerName::try_from("db.example").expect("name"),
            CertProblem::NameMismatch {
                presented: vec!["localhost".into()],
            },
        );
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rejected);
        let wrapped: Box<dyn std::error::Error + Sync + Send> = Box::new(io);
        let found = find_rejection(Some(&*wrapped)).expect("found");
        assert_eq!(found.host, "db.example");
        assert_eq!(
            found.to_string(),
            "the TLS certificate of db.example is not accepted: host name mismatch: the \
             certificate is valid for localhost only"
        );
    }

    #[test]
    fn names_the_certificate_holds_are_reported_without_webpkis_wrapping() {
        let mismatch = name_problem(TlsError::InvalidCertificate(
            CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("127.0.0.1").expect("address"),
                presented: vec![
                    "DnsName(\"localhost\")".into(),
                    "IpAddress(10.0.0.5)".into(),
                    "UniformResourceIdentifier(\"x\")".into(),
                ],
            },
        ));
        assert_eq!(
            mismatch,
            CertProblem::NameMismatch {
                presented: vec![
                    "localhost".into(),
                    "10.0.0.5".into(),
                    "UniformResourceIdentifier(\"x\")".into()
                ]
            }
        );
    }

    /// A self-signed CA certificate (EC P-256), only parsed here, never used to verify.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBgzCCASqgAwIBAgIUJIzOTIMampKLe7AIYy8zOI0yS/gwCgYIKoZIzj0EAwIw
HzEdMBsGA1UEAwwUaWRlbWxvZyB1bml0LXRlc3QgQ0EwIBcNMjYxMjA0MTgxODEw
WhgPMjEyNjExMTAxODE4MTBaMB8xHTAbBgNVBAMMFGlkZW1sb2cgdW5pdC10ZXN0
IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEfd5gjI9Z/9KdFX7usbMF0BlV
LVzSGYbpH9q5YpcKw7qzau2cpdlNplOAer5ObBy0YBvfyWfcCD7W8l5lVpGNT6NC
MEAwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAQYwHQYDVR0OBBYEFLep
n/8S1D2lJHfy6V5/ESxWD8H/MAoGCCqGSM49BAMCA0cAMEQCIDGdFHA7oJUEtGmT
weKDYDlB8dhWSM8xvV/RyS9wLj1pAiBmI77EBUkJd3lhk2DR/3a+wu+hIrKD5bKc
f+lV4BNNtw==
-----END CERTIFICATE-----
";
}
