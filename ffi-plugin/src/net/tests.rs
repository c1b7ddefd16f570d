//! Tests of the handle and connect-message encodings.
use super::*;

#[test]
fn handles_round_trip() {
    let name = EndpointName::from_bytes(b"fi_shm://1234:0:0\0").unwrap();
    let mut h = encode_handle(3, 77, 0xdead_beef, &name).unwrap();
    let d = decode_handle(&h).unwrap();
    assert_eq!((d.provider, d.listen_id, d.nonce, d.token), (3, 77, 0xdead_beef, 0));
    assert_eq!(d.name.as_bytes(), name.as_bytes());
    h[TOKEN_AT..TOKEN_AT + 8].copy_from_slice(&42u64.to_le_bytes());
    assert_eq!(decode_handle(&h).unwrap().token, 42);
    h[0] = b'X';
    assert!(decode_handle(&h).is_err());
    let long = EndpointName::from_bytes(&[1u8; HANDLE_NAME_MAX + 1]).unwrap();
    assert!(encode_handle(3, 1, 1, &long).is_err());
}

#[test]
fn connect_messages_are_checked() {
    let name = EndpointName::from_bytes(&[7u8; 16]).unwrap();
    let m = encode_connect(2, 5, 9, &name);
    assert_eq!(check_connect(&m, 2, 5, 9).unwrap(), vec![7u8; 16]);
    assert!(matches!(check_connect(&m, 3, 5, 9), Err(Error::InvalidUsage(_))));
    assert!(check_connect(&m, 2, 6, 9).is_err());
    assert!(check_connect(&m, 2, 5, 8).is_err());
    assert!(check_connect(&m[..10], 2, 5, 9).is_err());
}

#[test]
fn tags_keep_connections_apart() {
    assert_ne!(data_tag(1, 0), data_tag(2, 0));
    assert_ne!(data_tag(1, 0), connect_tag(1));
    assert_eq!(data_tag(LISTEN_ID_MAX, u32::MAX) >> 63, 0);
}
