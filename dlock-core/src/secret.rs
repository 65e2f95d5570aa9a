//! Secrets kept out of messages: the passwords in urls and connection
//! strings, masked as `***`. A leaf module, so that both the config and the
//! engine kit can use it.

/// `url` with the password in it replaced by `***`, for messages. The
/// password is what stands between the first `:` after the scheme's `//`
/// and the url's last `@`: a `/`, `@` or `:` in it, unencoded as it must
/// not be, still stays out of the message.
pub fn without_password(url: &str) -> String {
    let from = url.find("//").map_or(0, |i| i + 2);
    let Some(at) = url[from..].rfind('@').map(|i| i + from) else {
        return url.to_owned();
    };
    match url[from..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..from + colon], &url[at..]),
        None => url.to_owned(),
    }
}

/// `text` with a url's password, or a key/value string's `password=...`,
/// as `***`.
pub(crate) fn masked(text: &str) -> String {
    let text = without_password(text);
    let Some(at) = text.find("password=") else {
        return text;
    };
    let value = &text[at + "password=".len()..];
    let end = match value.strip_prefix('\'') {
        // Quoted: to the closing quote that no backslash escapes.
        Some(quoted) => {
            let mut escaped = false;
            quoted
                .char_indices()
                .find(|&(_, c)| {
                    let close = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    close
                })
                .map_or(value.len(), |(i, _)| i + 2)
        }
        None => value.find(char::is_whitespace).unwrap_or(value.len()),
    };
    format!("{}password=***{}", &text[..at], &value[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(without_password("redis://u:secret@h:1"), "redis://u:***@h:1");
        assert_eq!(without_password("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(
            without_password("redis://u:pa/ss@127.0.0.1:6790"),
            "redis://u:***@127.0.0.1:6790"
        );
        assert_eq!(without_password("redis://u:p@s:s@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(without_password("redis//h:1"), "redis//h:1");
        assert_eq!(without_password("redis//u:secret@h"), "redis//u:***@h");
        assert_eq!(without_password("u:secret@h"), "u:***@h");
        assert_eq!(without_password("redis://u@h:1"), "redis://u@h:1");
        assert_eq!(
            without_password("postgres://u:p@h/db?x=y"),
            "postgres://u:***@h/db?x=y"
        );
    }
}
