//! How tally starts itself: the rank processes of `tally bench allreduce`
//! (and so of `tally demo`) are this same binary, run again.
//!
//! `TALLY_EXEC_WRAPPER` puts a command in front of it, as cargo's
//! `target.<triple>.runner` does: an aarch64 `tally` run under qemu-user on
//! an x86 host (scripts/build/test-aarch64-e2e.sh) cannot exec its own
//! binary without the kernel's binfmt_misc registration, which containers
//! and CI hosts rarely have, so it names `qemu-aarch64` here and each rank
//! is emulated too. Words are split on spaces; unset or empty, nothing is
//! put in front.
use std::process::Command;

/// A command that runs this binary (behind `TALLY_EXEC_WRAPPER`, if set).
pub fn command() -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary to start it again: {e}"))?;
    let wrapper = std::env::var("TALLY_EXEC_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    Ok(match words.next() {
        None => Command::new(exe),
        Some(first) => {
            let mut c = Command::new(first);
            c.args(words).arg(exe);
            c
        }
    })
}
