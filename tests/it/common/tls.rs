//! A test certificate authority (openssl), for the TLS tests.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A certificate authority made for one test by `openssl` (in `dir`): a server certificate
/// for 127.0.0.1 and a client certificate issued by it, and a client certificate of another,
/// untrusted CA. PEM files; keys unencrypted.
pub struct TestCa {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
}

impl TestCa {
    /// Makes the files, or None when `openssl` is missing (see `tool`).
    pub fn make(dir: &Path) -> Option<TestCa> {
        let openssl = tool("openssl", SETUP_DEPLOY_TOOLS)?;
        let p = |name: &str| dir.join(name);
        let run = |args: &[&str]| {
            let out = run_with_timeout(
                {
                    let mut c = Command::new(&openssl);
                    c.args(args).current_dir(dir);
                    c
                },
                Duration::from_secs(30),
            );
            assert!(out.success(), "openssl {args:?}: {}", out.describe());
        };
        let self_signed = |name: &str, cn: &str| {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ]);
        };
        let issued = |name: &str, cn: &str, extensions: &str| {
            run(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            fs::write(p(&format!("{name}.ext")), extensions).unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ]);
        };
        self_signed("ca", "pyfleet test CA");
        issued(
            "server",
            "127.0.0.1",
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        issued(
            "client",
            "scraper",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
        self_signed("rogue", "rogue scraper");
        Some(TestCa {
            ca: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.pem"),
            client_key: p("client.key"),
            rogue_cert: p("rogue.pem"),
            rogue_key: p("rogue.key"),
        })
    }
}
