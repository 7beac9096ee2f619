use std::path::Path;

use super::*;

const GOOD: &str = r#"[reactors]
cores = [0, 1]

[transport]
provider = "soft"
listen = ["127.0.0.1:4420"]

[[bdev]]
name = "m0"
kind = "malloc"
size = 1048576

[[bdev]]
name = "f0"
kind = "file"
path = "/tmp/x.img"

[[subsystem]]
nqn = "nqn.2016-06.io.nvmf-rs:a"
hosts = ["nqn.2014-08.org.nvmexpress:uuid:2b4c8d1e-0f3a-4e5b-9c6d-7e8f9a0b1c2d"]
[[subsystem.namespace]]
nsid = 1
bdev = "m0"
"#;

#[test]
fn examples_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    for name in ["demo.toml", "rdma.toml", "multicore.toml", "file.toml"] {
        let c = Config::load(&dir.join(name)).unwrap_or_else(|e| panic!("{name}:\n{e}"));
        assert!(!c.subsystems.is_empty(), "{name}");
    }
    let demo = Config::load(&dir.join("demo.toml")).unwrap();
    assert_eq!(demo.reactors.cores.get_ref(), &vec![0, 1]);
    assert_eq!(demo.transport.provider, Provider::Soft);
    assert_eq!(demo.transport.fabric(), Fabric::Tcp);
    let kinds: Vec<_> = demo.bdevs.iter().map(|b| *b.kind.get_ref()).collect();
    assert_eq!(kinds, [BdevKind::Malloc, BdevKind::Null]);
    assert_eq!(demo.transport.mdts(), 5); // 128 KiB = 32 pages of 4 KiB
    let file = Config::load(&dir.join("file.toml")).unwrap();
    assert!(file.bdevs[0].direct());
}

#[test]
fn good_config_parses() {
    let c = Config::parse(GOOD, "good.toml").unwrap();
    assert_eq!(*c.transport.max_queue_depth.get_ref(), 128);
    assert_eq!(*c.transport.in_capsule_data_size.get_ref(), 4096);
    assert_eq!(*c.bdevs[0].block_size.get_ref(), 512);
    assert!(!c.subsystems[0].allow_any_host);
    assert_eq!(c.reactors.idle_after(), nvmf_poller::DEFAULT_IDLE_AFTER);
    let busy = GOOD.replacen("cores = [0, 1]", "cores = [0, 1]\nbusy_poll = true", 1);
    let busy = Config::parse(&busy, "busy.toml").unwrap();
    assert_eq!(busy.reactors.idle_after(), std::time::Duration::MAX);
    let idle = GOOD.replacen("cores = [0, 1]", "cores = [0, 1]\nidle_after_us = 50", 1);
    let idle = Config::parse(&idle, "idle.toml").unwrap();
    assert_eq!(
        idle.reactors.idle_after(),
        std::time::Duration::from_micros(50)
    );
    assert!(c.transport.remote_invalidate, "on unless the file says no");
    let plain = broken(
        "listen = [\"127.0.0.1:4420\"]",
        "listen = [\"127.0.0.1:4420\"]\nremote_invalidate = false",
    );
    assert!(
        !Config::parse(&plain, "plain.toml")
            .unwrap()
            .transport
            .remote_invalidate
    );
}

/// Replace the first occurrence of `from` in GOOD with `to`.
#[test]
fn small_io_units_up_to_a_requests_buffers_are_valid() {
    // 128 KiB in 4 KiB units: 32 buffers, what a request holds (transfers needing more SGEs
    // than one chain are moved in several).
    let text = GOOD.replacen(
        "listen = [\"127.0.0.1:4420\"]",
        "listen = [\"127.0.0.1:4420\"]\nmax_io_size = 131072\nio_unit_size = 4096",
        1,
    );
    let c = Config::parse(&text, "small-units.toml").unwrap();
    assert_eq!(*c.transport.io_unit_size.get_ref(), 4096);
}

fn broken(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from:?} not in GOOD");
    GOOD.replacen(from, to, 1)
}

#[test]
fn broken_configs_name_file_line_and_key() {
    // (edit, expected "file:line: key" prefix, text the message must contain)
    let table: Vec<(String, &str, &str)> = vec![
        (
            broken("provider = \"soft\"", "provder = \"soft\""),
            "bad.toml:5: transport.provder",
            "unknown field",
        ),
        (
            broken("provider = \"soft\"", "provider = \"ib\""),
            "bad.toml:5: transport.provider",
            "unknown variant",
        ),
        (
            broken("cores = [0, 1]", "cores = [0, 0]"),
            "bad.toml:2: reactors.cores",
            "listed twice",
        ),
        (
            broken(
                "cores = [0, 1]",
                "cores = [0, 1]\nbusy_poll = true\nidle_after_us = 50",
            ),
            "bad.toml:4: reactors.idle_after_us",
            "no effect with busy_poll",
        ),
        (
            broken("cores = [0, 1]", "cores = [0, 1]\nbusy_pol = true"),
            "bad.toml:3: reactors.busy_pol",
            "unknown field",
        ),
        (
            broken("cores = [0, 1]", "cores = []"),
            "bad.toml:2: reactors.cores",
            "at least one",
        ),
        (
            broken("listen = [\"127.0.0.1:4420\"]", "listen = [\"127.0.0.1\"]"),
            "bad.toml:6: transport.listen",
            "socket address",
        ),
        (
            broken("size = 1048576", "size = 1000"),
            "bad.toml:11: bdev.size",
            "multiple of block_size",
        ),
        (
            broken("size = 1048576", "size = 1048576\nblock_size = 1024"),
            "bad.toml:12: bdev.block_size",
            "not a supported block size",
        ),
        (
            broken("kind = \"malloc\"", "kind = \"ram\""),
            "bad.toml:10: bdev.kind",
            "unknown variant",
        ),
        (
            broken("name = \"f0\"", "name = \"m0\""),
            "bad.toml:14: bdev.name",
            "duplicate bdev name",
        ),
        (
            broken("path = \"/tmp/x.img\"", ""),
            "bad.toml:15: bdev.path",
            "needs a path",
        ),
        (
            broken(
                "nqn = \"nqn.2016-06.io.nvmf-rs:a\"",
                "nqn = \"iqn.2016-06.x\"",
            ),
            "bad.toml:19: subsystem.nqn",
            "invalid NQN",
        ),
        (
            broken(
                "nqn = \"nqn.2016-06.io.nvmf-rs:a\"",
                "nqn = \"nqn.2014-08.org.nvmexpress.discovery\"",
            ),
            "bad.toml:19: subsystem.nqn",
            "discovery",
        ),
        (
            broken("hosts = [\"nqn", "hosts = [\"nq"),
            "bad.toml:20: subsystem.hosts",
            "invalid host NQN",
        ),
        (
            broken("bdev = \"m0\"", "bdev = \"m9\""),
            "bad.toml:23: subsystem.namespace.bdev",
            "no [[bdev]] named",
        ),
        (
            broken("nsid = 1", "nsid = 0"),
            "bad.toml:22: subsystem.namespace.nsid",
            "outside",
        ),
        (
            broken("nsid = 1\n", "nsid = 1\nuuid = \"zz\"\n"),
            "bad.toml:23: subsystem.namespace.uuid",
            "not a UUID",
        ),
        (
            broken("nsid = 1\n", "nsid = 1\nnguid = \"0011\"\n"),
            "bad.toml:23: subsystem.namespace.nguid",
            "not an NGUID",
        ),
        (
            broken("nsid = 1\n", "nsid = 1\ncolour = 3\n"),
            "bad.toml:23: subsystem.namespace.colour",
            "unknown field",
        ),
        (
            broken("[reactors]\ncores = [0, 1]\n", "[reactors]\n"),
            "bad.toml:1: reactors.cores",
            "missing field",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:4420\"]\nmax_io_size = 100000",
            ),
            "bad.toml:7: transport.max_io_size",
            "power of two",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:4420\"]\nmax_io_size = 262144\nio_unit_size = 4096",
            ),
            "bad.toml:7: transport.max_io_size",
            "needs more than 32 buffers of io_unit_size 4096",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:4420\"]\nmax_aq_depth = 8",
            ),
            "bad.toml:7: transport.max_aq_depth",
            "outside",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:4420\"]\nin_capsule_data_size = 100",
            ),
            "bad.toml:7: transport.in_capsule_data_size",
            "multiple of 16",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:4420\"]\nsilent_answers = 65",
            ),
            "bad.toml:7: transport.silent_answers",
            "65 is outside 0..=64",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:4420\"]\nremote_invalidate = \"no\"",
            ),
            "bad.toml:7: transport.remote_invalidate",
            "expected a boolean",
        ),
        (
            broken("hosts = [", "listen = [\"127.0.0.2:4420\"]\nhosts = ["),
            "bad.toml:20: subsystem.listen",
            "not in transport.listen",
        ),
        (
            broken("hosts = [", "listen = []\nhosts = ["),
            "bad.toml:19: subsystem.listen",
            "reachable nowhere",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"0.0.0.0:4420\"]",
            ),
            "bad.toml:6: transport.listen",
            "not a wildcard",
        ),
        (
            broken(
                "listen = [\"127.0.0.1:4420\"]",
                "listen = [\"127.0.0.1:0\"]",
            ),
            "bad.toml:6: transport.listen",
            "name the port",
        ),
        (
            broken("hosts = [", "allow_any_host = true\nhosts = ["),
            "bad.toml:",
            "list hosts or allow any, not both",
        ),
    ];
    for (text, want, contains) in &table {
        let errors = Config::parse(text, "bad.toml").expect_err(want).0;
        let first = errors[0].to_string();
        assert!(
            first.starts_with(want) && first.contains(contains),
            "want {want:?} containing {contains:?}, got:\n{}",
            ConfigErrors(errors.clone())
        );
    }
}

#[test]
fn duplicate_nsid_nqn_and_bdev_claim() {
    let text = format!(
        "{GOOD}[[subsystem.namespace]]\nnsid = 1\nbdev = \"f0\"\n\n[[subsystem]]\nnqn = \"nqn.2016-06.io.nvmf-rs:a\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbdev = \"m0\"\n"
    );
    let errors: Vec<String> = Config::parse(&text, "d.toml")
        .unwrap_err()
        .0
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].starts_with("d.toml:25: subsystem.namespace.nsid: duplicate nsid 1"));
    assert!(errors[1].starts_with("d.toml:29: subsystem.nqn: duplicate subsystem NQN"));
    assert!(errors[2].starts_with("d.toml:33: subsystem.namespace.bdev: bdev \"m0\" is already"));
}

#[test]
fn every_error_is_reported() {
    let text = broken("cores = [0, 1]", "cores = [0, 0]").replace("size = 1048576", "size = 7");
    let errors = Config::parse(&text, "x.toml").unwrap_err();
    assert_eq!(errors.0.len(), 2, "{errors}");
}

#[test]
fn unreadable_file() {
    let e = Config::load(Path::new("/nonexistent/x.toml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/x.toml: cannot read")
    );
}

#[test]
fn uuid_and_nguid_parse() {
    assert_eq!(
        validate::parse_uuid("6a1f1e0c-4d2b-4c8e-9a57-0b7d6f3e2a11").unwrap()[..2],
        [0x6a, 0x1f]
    );
    assert!(validate::parse_uuid("6a1f1e0c4d2b-4c8e-9a57-0b7d6f3e2a11").is_none());
    assert!(validate::parse_hex16("0123456789abcdef0123456789abcdeg").is_none());
}

proptest::proptest! {
    /// User input never panics the parser, and every error points into the file.
    #[test]
    fn parse_never_panics(cut in 0usize..GOOD.len(), insert in "[ -~\n]{0,40}") {
        let mut text = GOOD.as_bytes()[..cut].to_vec();
        text.extend_from_slice(insert.as_bytes());
        text.extend_from_slice(&GOOD.as_bytes()[cut..]);
        let text = String::from_utf8_lossy(&text).into_owned();
        if let Err(errors) = Config::parse(&text, "p.toml") {
            for e in errors.0 {
                proptest::prop_assert!(e.line >= 1 && e.line <= text.lines().count() + 1, "{e}");
            }
        }
    }

    /// Arbitrary bytes (as text) never panic it either.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = Config::parse(&text, "p.toml");
    }
}
