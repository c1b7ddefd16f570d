//! The shared job token a server admits ranks with, read once at start.
//!
//! `token_file` if the configuration names one, else `TALLY_TOKEN`, else no
//! token (the server warns and admits anyone). A token that is present but
//! empty or blank is refused rather than read: its wire form would be 32
//! zero bytes, the same as a client that sends no token, so an operator who
//! meant to set one (an empty file left by `install /dev/null`, a variable
//! whose secret did not resolve) would run open without the warning.
//! `tally server --check` calls [`load`] as the start does, so the check
//! cannot pass a token the start refuses.
use super::error::{SetupError, TokenSource};
use crate::host::config::ServerConfig;
use crate::wire::{self, TOKEN_BYTES};

/// The server's token: `None` when none is configured (`token_file` absent
/// and `TALLY_TOKEN` unset).
pub fn load(cfg: &ServerConfig) -> Result<Option<[u8; TOKEN_BYTES]>, SetupError> {
    match &cfg.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| SetupError::TokenFile { path: path.clone(), source })?;
            parse(&text, TokenSource::File(path.clone())).map(Some)
        }
        None => match std::env::var_os("TALLY_TOKEN") {
            None => Ok(None),
            // Not UTF-8 is refused, not taken as unset: unset means no token.
            Some(v) => parse(v.to_str().ok_or(SetupError::TokenNotUtf8)?, TokenSource::Env).map(Some),
        },
    }
}

/// The wire form of a configured token's text (`from` names where it was
/// read, for the error). Surrounding whitespace (a file's last newline) is
/// not part of the token, as [`wire::token_bytes`] trims it.
fn parse(text: &str, from: TokenSource) -> Result<[u8; TOKEN_BYTES], SetupError> {
    if text.trim().is_empty() {
        return Err(SetupError::EmptyToken(from));
    }
    wire::token_bytes(text).ok_or(SetupError::TokenTooLong(from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::config::ServerFile;

    fn with_token_file(path: &str) -> ServerConfig {
        ServerConfig { token_file: Some(path.to_string()), ..ServerFile::default().resolve().unwrap() }
    }

    fn with_file(name: &str, text: &str) -> (ServerConfig, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("tally-token-unit-{name}-{}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let cfg = with_token_file(&path.display().to_string());
        (cfg, path)
    }

    #[test]
    fn a_file_token_is_trimmed_and_padded() {
        let (cfg, path) = with_file("ok", "s3cret\n");
        let t = load(&cfg).unwrap().unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(&t[..6], b"s3cret");
        assert!(t[6..].iter().all(|&b| b == 0));
    }

    #[test]
    fn an_empty_or_blank_file_is_refused_with_the_fix() {
        for (name, text) in [("empty", ""), ("blank", " \n\t\n")] {
            let (cfg, path) = with_file(name, text);
            let e = load(&cfg).unwrap_err();
            let _ = std::fs::remove_file(&path);
            assert!(matches!(&e, SetupError::EmptyToken(TokenSource::File(p)) if *p == path.display().to_string()), "{e:?}");
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("token_file {} is empty: write a token", path.display())), "{msg}");
            assert!(msg.contains("openssl rand -hex 16") && msg.contains("remove token_file"), "{msg}");
        }
    }

    #[test]
    fn a_missing_or_too_long_file_token_is_refused() {
        let cfg = with_token_file("/nonexistent/tally-token");
        assert!(matches!(load(&cfg), Err(SetupError::TokenFile { .. })));
        let (cfg, path) = with_file("long", &"x".repeat(TOKEN_BYTES + 1));
        let e = load(&cfg).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(matches!(&e, SetupError::TokenTooLong(TokenSource::File(_))), "{e:?}");
        assert!(e.to_string().contains(&format!("longer than {TOKEN_BYTES} bytes")), "{e}");
    }

    #[test]
    fn a_set_but_empty_variable_is_refused() {
        // The variable itself is not set here (tests share the process's
        // environment): `load` hands its value to `parse` as below.
        for text in ["", "  "] {
            let e = parse(text, TokenSource::Env).unwrap_err();
            assert!(matches!(e, SetupError::EmptyToken(TokenSource::Env)), "{e:?}");
            assert!(e.to_string().starts_with("TALLY_TOKEN is set but empty: set a token"), "{e}");
        }
        assert_eq!(&parse(" abc ", TokenSource::Env).unwrap()[..4], b"abc\0");
        let e = parse(&"y".repeat(TOKEN_BYTES + 1), TokenSource::Env).unwrap_err();
        assert!(e.to_string().starts_with("TALLY_TOKEN: the token is longer than"), "{e}");
    }
}
