//! The client's side: arbitrary bytes from a server read as a Reject and as
//! a NameRecord. Proves no panic, bounded NUL-free text whatever the bytes
//! (including text that is not UTF-8), and that a name read back is valid.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tally_engine::wire::{self, NameRecord, Reject, WireError, NAME_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = wire::read::<Reject>(data) {
        let (field, message) = (r.field(), r.message());
        assert!(field.len() <= 24 && !field.contains('\0'));
        assert!(message.len() <= 216 && !message.contains('\0'));
        let shown = r.to_string();
        assert!(shown.contains(message) && shown.contains(field));
        let _ = r.code();
    }
    if let Ok(n) = wire::read::<NameRecord>(data) {
        match n.name() {
            Ok(name) => {
                assert!(
                    !name.is_empty() && name.len() <= NAME_BYTES && name.len() == n.len as usize
                );
                assert_eq!(NameRecord::new(name).unwrap().name().unwrap(), name);
            }
            Err(e) => assert_eq!(e, WireError::BadNameLength(n.len)),
        }
    }
});
