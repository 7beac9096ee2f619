//! `nvmf write-zeroes`, `nvmf dsm --ad` and `nvmf flush` against nvmf-tgt, on the file-backed
//! namespace (1: fallocate ZERO_RANGE and PUNCH_HOLE through io_uring) and the malloc one (2):
//! exactly the blocks named read back as zeroes, the rest as written, and for the file the
//! bytes on disk say the same; bad ranges are refused with a message naming them.

use crate::rig::{Rig, sigterm};

/// Blocks written before zeroing (512 B each), from LBA `FIRST`.
const BLOCKS: usize = 64;
const FIRST: usize = 8;

#[test]
#[ignore = "starts the built nvmf-tgt and nvmf: scripts/process-e2e.sh builds them and runs it"]
fn write_zeroes_and_deallocate_clear_exactly_their_blocks() {
    let rig = Rig::new();
    let mut target = rig.start_target("nvmf-tgt.log");
    let written: Vec<u8> = (0..BLOCKS * 512).map(|i| (i % 251) as u8 | 1).collect();
    let data = rig.dir.path().join("written.bin");
    std::fs::write(&data, &written).expect("data file");
    // Blocks 20..30 zeroed, 40..42 and 50..53 deallocated (nvmf-tgt's DLFEAT: read as zeroes).
    let mut expected = written.clone();
    for (lba, n) in [(20, 10), (40, 2), (50, 3)] {
        expected[(lba - FIRST) * 512..(lba - FIRST + n) * 512].fill(0);
    }
    for nsid in [1, 2] {
        let ns = nsid.to_string();
        let nvmf =
            |args: &[&str]| rig.nvmf_ok(&[&args[..1], &["--nsid", &ns], &args[1..]].concat());
        rig.block_io("write", nsid, FIRST, BLOCKS, &data);
        let out = nvmf(&["write-zeroes", "-s", "20", "-c", "10"]);
        assert!(out.contains("write-zeroes: Success"), "{out}");
        let out = nvmf(&["dsm", "--ad", "--slbs", "40,50", "--blocks", "2,3"]);
        assert!(out.contains("dsm: Success (2 ranges"), "{out}");
        let out = nvmf(&["flush"]);
        assert!(out.contains("flush: Success"), "{out}");
        let back = rig.dir.path().join(format!("back-{nsid}.bin"));
        rig.block_io("read", nsid, FIRST, BLOCKS, &back);
        assert!(
            std::fs::read(&back).expect("read back") == expected,
            "namespace {nsid}: not exactly the named blocks read as zeroes"
        );
    }
    // The file namespace's bytes on disk, past the flush.
    let image = std::fs::read(rig.dir.path().join("keep.img")).expect("namespace file");
    assert!(
        image[FIRST * 512..(FIRST + BLOCKS) * 512] == expected[..],
        "the namespace file does not hold what was read back"
    );

    // Bad ranges: refused before anything is sent, with what is wrong.
    for (args, says) in [
        (
            &["write-zeroes", "-s", "2040", "-c", "9"][..],
            "blocks 2040+9 end past the namespace's 2048 blocks",
        ),
        (
            &["dsm", "--ad", "-s", "0", "-b", "0"][..],
            "a range needs at least one block",
        ),
        (
            &["dsm", "--ad", "-s", "0,1", "-b", "1"][..],
            "--slbs has 2 entries and --blocks 1",
        ),
    ] {
        let (status, _, err) = rig.nvmf(args);
        assert!(!status.success(), "nvmf {args:?} succeeded");
        assert!(err.contains(says), "nvmf {args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let image_after = std::fs::read(rig.dir.path().join("keep.img")).expect("namespace file");
    assert!(
        image_after == image,
        "a refused command changed the namespace"
    );
    let status = sigterm(&mut target);
    assert!(status.success(), "nvmf-tgt: {status}");

    // The target gone: the failure is one line, each cause in it once (the library errors'
    // messages hold their causes' text too, and anyhow's list repeated it).
    let (status, _, err) = rig.nvmf(&["connect"]);
    assert!(!status.success(), "connected to a stopped target");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: connect to "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    let last = line.rsplit(": ").next().unwrap_or_default();
    assert_eq!(line.matches(last).count(), 1, "{line}");
    assert!(!err.contains("Caused by"), "{err}");
}
