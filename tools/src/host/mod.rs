//! Host preparation commands: hugepages, efa-env, doctor. (Being written.)
use clap::Args;

#[derive(Args, Debug)]
pub struct HugepagesArgs {}
#[derive(Args, Debug)]
pub struct EfaEnvArgs {}
#[derive(Args, Debug)]
pub struct DoctorArgs {}

pub fn run_hugepages(_: &HugepagesArgs) -> Result<(), String> {
    Err("not yet available".into())
}
pub fn run_efa_env(_: &EfaEnvArgs) -> Result<(), String> {
    Err("not yet available".into())
}
/// Returns the process exit code (1 when a check fails).
pub fn run_doctor(_: &DoctorArgs) -> Result<u8, String> {
    Err("not yet available".into())
}
