use super::*;
use std::time::Duration;

/// The acceptance sample of the configuration file.
pub(crate) const SAMPLE: &str = r#"
listen = "127.0.0.1:8080"
database = "sqlite://resumable.db"

[[keys]]
key = "key-alice-0001"
actor = "alice"
tenant = "acme"
roles = ["submitter", "approver"]

[[keys]]
key = "key-bob-0001"
actor = "bob"
tenant = "acme"
roles = ["approver"]

[functions."billing.refund"]
url = "http://127.0.0.1:9000/refund"
params = [{ name = "order_id", type = "string" }, { name = "amount", type = "integer" }]
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
timeout = "5s"
retries = 3
approval = { when = "args.amount > 1000" }
approvers = ["approver"]
four_eyes = true
summary = "Refund {amount} on order {order_id}"

[functions."billing.order"]
url = "http://127.0.0.1:9000/order"
params = [{ name = "order_id", type = "string" }]
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
approval = "never"
"#;

#[test]
fn the_sample_reads_as_written() {
    let config = ServeConfig::parse(SAMPLE).unwrap();
    assert_eq!(config.file.listen, Some("127.0.0.1:8080".parse().unwrap()));
    assert_eq!(config.keys.len(), 2);
    let alice = config.keys.caller("key-alice-0001").unwrap();
    assert_eq!((alice.actor.as_str(), alice.tenant.as_str(), alice.roles.len()), ("alice", "acme", 2));
    let names: Vec<&str> = config.functions.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(names, ["billing.order", "billing.refund"]);
    let (_, refund, secret) = &config.functions[1];
    assert_eq!(refund.approval, Approval::When("args.amount > 1000".into()));
    assert_eq!((refund.retries, refund.four_eyes, secret.len()), (3, true, 24));
    assert_eq!(refund.timeout.unwrap().0, Duration::from_secs(5));
    assert_eq!(refund.params[1].schema.0, serde_json::json!({ "type": "integer" }));
    assert!(config.holds_clear_secrets());
}

#[test]
fn a_key_may_be_given_by_its_digest_or_its_environment_variable() {
    // SHA-256 of "key-carol-0001".
    let digest = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(b"key-carol-0001"));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    // SAFETY-free environment: the variable's name is unique to this test.
    let text = format!(
        r#"[[keys]]
key_sha256 = "{hex}"
actor = "carol"
tenant = "acme"
roles = ["finance"]
"#
    );
    let config = ServeConfig::parse(&text).unwrap();
    assert_eq!(config.keys.caller("key-carol-0001").unwrap().actor, "carol");
    assert!(!config.holds_clear_secrets(), "a digest is no secret");
}

/// Each malformed file, and what its error must name.
const MALFORMED: &[(&str, &str, &[&str])] = &[
    ("unknown key", "listen = \"127.0.0.1:1\"\nlistne = 1\n", &["line 2", "listne"]),
    ("wrong type", "workers = \"many\"\n", &["line 1", "workers", "usize"]),
    (
        "bad URL",
        "[functions.\"a.b\"]\nurl = \"ftp://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        &["line 2", "url", "http://"],
    ),
    (
        "bad duration",
        "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\ntimeout = \"5 parsecs\"\n",
        &["line 4", "timeout", "duration"],
    ),
    (
        "bad schema",
        "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nparams = [{ name = \"n\", type = \"strnig\" }]\n",
        &["line 4", "type", "JSON Schema"],
    ),
    ("bad secret", "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"hunter2\"\n", &["line 3", "secret", "whsec_"]),
    (
        "duplicate function",
        "[functions.\"a.b\"]\nurl = \"http://x\"\n[functions.\"a.b\"]\nurl = \"http://y\"\n",
        &["line 3", "duplicate", "a.b"],
    ),
    ("reserved namespace", "[functions.\"session.read\"]\nurl = \"http://x\"\n", &["line 1", "session", "reserved"]),
    (
        "quorum 0",
        "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nquorum = 0\n",
        &["line 4", "quorum", "nonzero"],
    ),
    (
        "a key without roles",
        "[[keys]]\nkey = \"key-alice-0001\"\nactor = \"a\"\ntenant = \"t\"\nroles = []\n",
        &["line 1", "keys[0]", "role"],
    ),
    (
        "a short key",
        "[[keys]]\nkey = \"short\"\nactor = \"a\"\ntenant = \"t\"\nroles = [\"approver\"]\n",
        &["keys[0]", "key: at least 8 characters"],
    ),
    (
        "two ways to give a key",
        "[[keys]]\nkey = \"key-alice-0001\"\nkey_env = \"X\"\nactor = \"a\"\ntenant = \"t\"\nroles = [\"approver\"]\n",
        &["keys[0]", "exactly one"],
    ),
    (
        "a function without a secret",
        "[functions.\"a.b\"]\nurl = \"http://x\"\n",
        &["line 1", "functions.\"a.b\"", "secret"],
    ),
    (
        "an unknown approval",
        "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\napproval = \"sometimes\"\n",
        &["line 4", "approval", "\"never\""],
    ),
    (
        "a summary naming no parameter",
        "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nsummary = \"Refund {amount}\"\n",
        &["line 1", "summary", "{amount}"],
    ),
    ("a bad function name", "[functions.\"refund\"]\nurl = \"http://x\"\n", &["line 1", "namespace.function"]),
];

#[test]
fn malformed_files_are_refused_naming_the_line_and_the_key() {
    for (what, text, expected) in MALFORMED {
        let error = ServeConfig::parse(text).expect_err(what);
        for needle in *expected {
            assert!(error.contains(needle), "{what}: {needle:?} missing from:\n{error}");
        }
    }
}

#[test]
fn a_file_with_secrets_that_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("resumable-config-{}", resumable_workflow::testing::random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("resumable.toml");
    std::fs::write(&path, SAMPLE).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = ServeConfig::load(&path).unwrap_err();
    assert!(matches!(refused, ConfigError::Exposed { mode: 0o644, .. }), "{refused}");
    assert!(refused.to_string().contains("chmod 600"), "{refused}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(ServeConfig::load(&path).is_ok());
    // Without a secret in clear, others may read it.
    std::fs::write(&path, "listen = \"127.0.0.1:1\"\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(ServeConfig::load(&path).is_ok());
    // Nobody else may change it, secrets or not: it says who may approve what.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    assert!(matches!(ServeConfig::load(&path), Err(ConfigError::Writable { mode: 0o664, .. })));
    // A database password is a secret too.
    std::fs::write(&path, "database = \"postgres://app:hunter2@db/prod\"\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(ServeConfig::load(&path), Err(ConfigError::Exposed { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn errors_never_repeat_a_secret() {
    let short_secret = "[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"whsec_c2hvcnQ=\"\n";
    let error = ServeConfig::parse(short_secret).unwrap_err();
    assert!(!error.contains("c2hvcnQ") && error.contains("line 3") && error.contains("secret"), "{error}");
    let inline_key = "keys = [{ key = \"verysecretkey123\", actor = \"a\", tenant = \"t\", roles = [\"bad role\"] }]\n";
    let error = ServeConfig::parse(inline_key).unwrap_err();
    assert!(!error.contains("verysecretkey123") && error.contains("keys"), "{error}");
    // A key given where a table was expected: the message would quote it.
    let error = ServeConfig::parse("keys = [\"mysecretkey123\"]\n").unwrap_err();
    assert!(!error.contains("mysecretkey123") && error.contains("keys"), "{error}");
    let error =
        ServeConfig::parse("[[keys]]\nkey = 12345678\nactor = \"a\"\ntenant = \"t\"\nroles = [\"r\"]\n").unwrap_err();
    assert!(!error.contains("12345678") && error.contains("line 2"), "{error}");
    // A secret on a continuation line of a multi-line string names no key from that line.
    let error = ServeConfig::parse("[functions.\"a.b\"]\nurl = \"http://x\"\nsecret = \"\"\"\nwhsec_ab\\q=\n\"\"\"\n")
        .unwrap_err();
    assert!(!error.contains("whsec_ab"), "{error}");
    // A URL with credentials is not repeated.
    let error = ServeConfig::parse("[functions.\"a.b\"]\nurl = \"ftp://u:hunter2@h\"\n").unwrap_err();
    assert!(!error.contains("hunter2"), "{error}");
}

#[test]
fn a_functions_signature_is_its_parameters_alone() {
    let signature = |text: &str| {
        let config = ServeConfig::parse(text).unwrap();
        config.functions.iter().find(|(name, _, _)| name.as_str() == "billing.refund").unwrap().1.signature()
    };
    let base = signature(SAMPLE);
    assert_eq!(
        base.as_str(),
        r#"[{"name":"order_id","schema":{"type":"string"}},{"name":"amount","schema":{"type":"integer"}}]"#
    );
    let elsewhere = SAMPLE
        .replace("http://127.0.0.1:9000/refund", "http://10.0.0.9:9001/v2/refund")
        .replace("timeout = \"5s\"", "timeout = \"30s\"")
        .replace("retries = 3", "retries = 1")
        .replace("Refund {amount} on order {order_id}", "Refund {amount} cents on {order_id}")
        .replace("args.amount > 1000", "args.amount > 10");
    assert_eq!(signature(&elsewhere), base, "URL, timeout, retries, summary and policy are not part of it");
    let typed_table = SAMPLE
        .replace(r#"{ name = "amount", type = "integer" }"#, r#"{ name = "amount", type = { type = "integer" } }"#);
    assert_eq!(signature(&typed_table), base, "a type name is the schema of that type");
    for changed in [
        SAMPLE
            .replace(r#"{ name = "amount", type = "integer" }"#, r#"{ name = "cents", type = "integer" }"#)
            .replace("{amount}", "{cents}"),
        SAMPLE.replace(r#"{ name = "amount", type = "integer" }"#, r#"{ name = "amount", type = "number" }"#),
        SAMPLE.replace(
            r#"{ name = "amount", type = "integer" }"#,
            r#"{ name = "amount", type = { type = "integer", minimum = 1 } }"#,
        ),
        SAMPLE.replace(r#", { name = "amount", type = "integer" }]"#, "]").replace(" {amount}", ""),
    ] {
        assert_ne!(signature(&changed), base, "{changed}");
    }
}
