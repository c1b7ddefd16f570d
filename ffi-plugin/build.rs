//! Link flags for the plugin library.
//!
//! NCCL dlcloses a network plugin after its last communicator is destroyed and
//! may dlopen it again later. The plugin starts no threads, but libfabric keeps
//! process-wide state (provider registrations, atexit handlers) reachable
//! from our image: `-z nodelete` keeps the library mapped after dlclose, so
//! nothing can ever call into unmapped code.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
