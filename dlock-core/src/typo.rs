//! "Did you mean": a config key one slip away from the one meant.

use serde::Deserialize;
use serde::de::{self, Visitor};

/// Whether `key` is `word` with one letter added, dropped or changed, or
/// two neighbours swapped.
pub(crate) fn typo_of(key: &str, word: &str) -> bool {
    let (key, word): (Vec<char>, Vec<char>) = (key.chars().collect(), word.chars().collect());
    let (short, long) = if key.len() <= word.len() {
        (&key, &word)
    } else {
        (&word, &key)
    };
    if key == word || long.len() - short.len() > 1 {
        return false;
    }
    // Past the first difference, the rest must match: after the changed
    // letter, or after the one the longer has in addition.
    let same = short.iter().zip(long.iter()).take_while(|(a, b)| a == b).count();
    let swapped = short.len() == long.len()
        && same + 1 < short.len()
        && (short[same], short[same + 1]) == (long[same + 1], long[same])
        && short[same + 2..] == long[same + 2..];
    let rest = if short.len() == long.len() { same + 1 } else { same };
    swapped || short.get(rest..) == long.get(same + 1..)
}

/// `message`, serde's for an unknown field, with the field it was likely
/// meant to be, from the names the message lists or `more`:
/// "unknown field `leese`, expected one of ...; did you mean `lease`?".
pub(crate) fn with_suggestion(message: String, more: &[&str]) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message;
    };
    let unknown = rest.split('`').next().unwrap_or_default();
    let listed = rest.split('`').skip(1).skip(1).step_by(2);
    let meant = listed
        .chain(more.iter().copied())
        .find(|name| typo_of(unknown, name));
    match meant {
        Some(meant) => format!("{message}; did you mean `{meant}`?"),
        None => message,
    }
}

/// The field names of the struct `T` deserializes from, as serde asks for
/// them: none for a struct with a field flattened into it.
pub(crate) fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Asked<'n>(&'n mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for Asked<'_> {
        type Error = de::value::Error;

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("names only"))
        }

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("names only"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Asked(&mut names));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_one_letter_added_dropped_changed_or_two_swapped() {
        assert!(typo_of("conect", "connect"));
        assert!(typo_of("connnect", "connect"));
        assert!(typo_of("cinnect", "connect"));
        assert!(typo_of("ur", "url"));
        assert!(typo_of("ulr", "url"));
        assert!(typo_of("laese", "lease"));
        assert!(!typo_of("connect", "connect"));
        assert!(!typo_of("cnect", "connect"));
        assert!(!typo_of("root", "url"));
        assert!(!typo_of("lr", "url"));
    }

    #[test]
    fn an_unknown_field_is_given_the_one_meant() {
        let serde = "unknown field `leese`, expected one of `engine`, `lease`, `wait`".to_owned();
        assert_eq!(
            with_suggestion(serde.clone(), &[]),
            format!("{serde}; did you mean `lease`?")
        );
        let bare = "unknown field `conect_timeout`".to_owned();
        assert_eq!(
            with_suggestion(bare.clone(), &["connect_timeout"]),
            format!("{bare}; did you mean `connect_timeout`?")
        );
        assert_eq!(with_suggestion(bare.clone(), &["url"]), bare, "nothing close");
    }

    #[test]
    fn a_structs_field_names_are_read_from_serde() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Two {
            url: String,
            connect_timeout: u32,
        }
        assert_eq!(field_names::<Two>(), ["url", "connect_timeout"]);
    }
}
