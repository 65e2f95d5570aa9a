//! Parses `#[distributed_lock(...)]` arguments into a typed model, keeping
//! each value's span so errors point at the offending token. The options are
//! one table, parsed in one loop: no per-option branch to drift.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Ident, LitInt, LitStr, Token};

use crate::suggest::nearest;
use crate::template::Template;

/// Every option, in the order the docs list them (`tests` holds the
/// rustdoc table of `distributed_lock` to it): its name, an example, and
/// where its value goes, which says how it is written.
const OPTIONS: [Spec; 13] = [
    Spec::text("group", "group = \"order\"", |g| &mut g.group),
    Spec::text("key", "key = \"<order_id>\"", |g| &mut g.key),
    Spec {
        name: "keys",
        example: "keys = [\"<from>\", \"<to>\"]",
        place: Place::Texts(|g| &mut g.keys),
    },
    Spec {
        name: "permits",
        example: "permits = 5",
        place: Place::Number(|g| &mut g.permits),
    },
    Spec::text("mode", "mode = \"write\"", |g| &mut g.mode),
    Spec::text("wait", "wait = \"5s\"", |g| &mut g.wait),
    Spec::text("lease", "lease = \"30s\"", |g| &mut g.lease),
    Spec::text("engine", "engine = \"main\"", |g| &mut g.engine),
    Spec::text("on_lost", "on_lost = \"cancel\"", |g| &mut g.on_lost),
    Spec::text("on_revoke", "on_revoke = \"cancel\"", |g| &mut g.on_revoke),
    Spec::text("if_held", "if_held = \"skip\"", |g| &mut g.if_held),
    Spec::text("hold_at_least", "hold_at_least = \"50s\"", |g| {
        &mut g.hold_at_least
    }),
    Spec::text("hold_at_most", "hold_at_most = \"10m\"", |g| &mut g.hold_at_most),
];

/// One option of the attribute.
struct Spec {
    name: &'static str,
    example: &'static str,
    place: Place,
}

impl Spec {
    const fn text(
        name: &'static str,
        example: &'static str,
        place: fn(&mut Given) -> &mut Option<LitStr>,
    ) -> Self {
        Spec {
            name,
            example,
            place: Place::Text(place),
        }
    }
}

/// Where an option's value goes in [`Given`]; its kind is how the value
/// is written.
enum Place {
    /// `name = "text"`.
    Text(fn(&mut Given) -> &mut Option<LitStr>),
    /// `name = ["text", ...]`.
    Texts(fn(&mut Given) -> &mut Option<Texts>),
    /// `name = 5`.
    Number(fn(&mut Given) -> &mut Option<LitInt>),
}

/// A list as written, with its option's name for errors about the list.
type Texts = (Ident, Vec<LitStr>);

/// The values written, each under its option's name.
#[derive(Default)]
struct Given {
    group: Option<LitStr>,
    key: Option<LitStr>,
    keys: Option<Texts>,
    permits: Option<LitInt>,
    mode: Option<LitStr>,
    wait: Option<LitStr>,
    lease: Option<LitStr>,
    engine: Option<LitStr>,
    on_lost: Option<LitStr>,
    on_revoke: Option<LitStr>,
    if_held: Option<LitStr>,
    hold_at_least: Option<LitStr>,
    hold_at_most: Option<LitStr>,
}

/// Shortest lease the core accepts (`dlock_core::MIN_LEASE`; a proc-macro
/// crate cannot use it, and `tests/attribute.rs` checks that the two agree).
const MIN_LEASE: Duration = Duration::from_millis(30);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Write,
    Read,
}

/// One attribute, checked.
pub(crate) struct Args {
    pub group: LitStr,
    /// `key`, or each of `keys`; none: the function's name.
    pub keys: Vec<Template>,
    /// `Some(n)`: a permit of the semaphore of `n` permits, not the lock.
    pub permits: Option<u32>,
    pub mode: Mode,
    pub wait: Option<Duration>,
    pub lease: Option<Duration>,
    pub engine: Option<LitStr>,
    pub cancel_on_lost: bool,
    pub cancel_on_revoke: bool,
    pub job: Job,
}

/// A run-once job's options; all unset for a plain lock.
#[derive(Default)]
pub(crate) struct Job {
    /// `if_held = "skip"`: the attribute itself, for errors about it.
    pub skip: Option<Span>,
    pub hold_at_least: Option<Duration>,
    pub hold_at_most: Option<Duration>,
    /// The first job option written, for errors about the whole job.
    pub span: Option<Span>,
}

/// `name = value`, as written, its value of the kind its option takes.
struct Item {
    name: Ident,
    spec: &'static Spec,
    value: Value,
}

enum Value {
    One(LitStr),
    List(Vec<LitStr>),
    Number(LitInt),
}

impl Parse for Item {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        let option = name.to_string();
        let Some(spec) = OPTIONS.iter().find(|spec| spec.name == option) else {
            return Err(syn::Error::new(name.span(), unknown_option(&option)));
        };
        if !input.peek(Token![=]) {
            let message = format!(
                "expected `{}`: every option is written `name = value`",
                spec.example
            );
            return Err(syn::Error::new(name.span(), message));
        }
        input.parse::<Token![=]>()?;
        let (fits, what) = match spec.place {
            Place::Text(_) => (input.peek(LitStr), "a string literal"),
            Place::Texts(_) => (input.peek(syn::token::Bracket), "a list of string literals"),
            Place::Number(_) => (input.peek(LitInt), "a whole number"),
        };
        if !fits {
            return Err(input.error(format!("`{option}` takes {what}, e.g. {}", spec.example)));
        }
        let value = match spec.place {
            Place::Text(_) => Value::One(input.parse()?),
            Place::Number(_) => Value::Number(input.parse()?),
            Place::Texts(_) => {
                let inside;
                syn::bracketed!(inside in input);
                let texts = Punctuated::<LitStr, Token![,]>::parse_terminated(&inside)?;
                Value::List(texts.into_iter().collect())
            }
        };
        Ok(Item { name, spec, value })
    }
}

impl Item {
    /// Puts the value in its place; an option given twice is an error.
    fn place(self, given: &mut Given) -> syn::Result<()> {
        let twice = || syn::Error::new(self.name.span(), format!("`{}` is given twice", self.name));
        match (&self.spec.place, self.value) {
            (Place::Text(place), Value::One(text)) => fill(place(given), text, twice),
            (Place::Texts(place), Value::List(texts)) => {
                fill(place(given), (self.name.clone(), texts), twice)
            }
            (Place::Number(place), Value::Number(number)) => fill(place(given), number, twice),
            _ => unreachable!("Item::parse reads the kind of value its place takes"),
        }
    }
}

fn fill<T>(slot: &mut Option<T>, value: T, twice: impl FnOnce() -> syn::Error) -> syn::Result<()> {
    if slot.is_some() {
        return Err(twice());
    }
    *slot = Some(value);
    Ok(())
}

impl Args {
    /// Parses the tokens inside the parentheses; `attr` spans the whole
    /// attribute, for errors about what is missing.
    pub fn parse(tokens: TokenStream, attr: Span) -> syn::Result<Self> {
        let items = Punctuated::<Item, Token![,]>::parse_terminated.parse2(tokens)?;
        let mut given = Given::default();
        for item in items {
            item.place(&mut given)?;
        }
        let Given {
            group,
            key,
            keys,
            permits,
            mode,
            wait,
            lease,
            engine,
            on_lost,
            on_revoke,
            if_held,
            hold_at_least,
            hold_at_most,
        } = given;
        let job = job(&if_held, &hold_at_least, &hold_at_most)?;
        if let Some(span) = job.span {
            if permits.is_some() {
                return Err(syn::Error::new(
                    span,
                    "a run-once job takes a lock, not a semaphore's permit: drop `permits`",
                ));
            }
            if let Some(mode) = mode.as_ref().filter(|m| m.value() == "read") {
                return Err(syn::Error::new(
                    mode.span(),
                    "a run-once job takes the write lock: drop `mode = \"read\"`",
                ));
            }
        }
        if let (Some(_), Some(wait)) = (job.skip, &wait) {
            return Err(syn::Error::new(
                wait.span(),
                "`if_held = \"skip\"` tries once and never waits: drop `wait`",
            ));
        }
        if let (Some(_), Some(on_lost)) = (
            job.hold_at_most,
            on_lost.as_ref().filter(|o| o.value() == "ignore"),
        ) {
            return Err(syn::Error::new(
                on_lost.span(),
                "`hold_at_most` stops the body at its limit; `on_lost = \"ignore\"` would let it run on",
            ));
        }
        let keys = match (key, keys) {
            (Some(key), None) => vec![Template::parse(key)?],
            (None, None) => Vec::new(),
            (Some(_), Some((name, _))) => {
                return Err(syn::Error::new(
                    name.span(),
                    "give `key` or `keys`, not both: `keys` lists every key, e.g. keys = [\"<from>\", \"<to>\"]",
                ));
            }
            (None, Some((name, list))) if list.is_empty() => {
                return Err(syn::Error::new(
                    name.span(),
                    "`keys` is empty; list each key, e.g. keys = [\"<from>\", \"<to>\"]",
                ));
            }
            (None, Some((_, list))) => list
                .into_iter()
                .map(Template::parse)
                .collect::<syn::Result<_>>()?,
        };

        let group = group.ok_or_else(|| {
            syn::Error::new(
                attr,
                "missing `group = \"...\"`: every lock belongs to a group, e.g. group = \"order\"",
            )
        })?;
        if group.value().is_empty() {
            return Err(syn::Error::new(
                group.span(),
                "`group` is empty; name what the lock protects, e.g. \"order\"",
            ));
        }
        let permits = match permits {
            Some(number) => {
                let n: u32 = number.base10_parse()?;
                if n == 0 {
                    return Err(syn::Error::new(
                        number.span(),
                        "`permits` is 0: a semaphore admits at least 1 holder",
                    ));
                }
                if let Some(mode) = mode.as_ref().filter(|m| m.value() == "read") {
                    return Err(syn::Error::new(
                        mode.span(),
                        "a semaphore's permits have no read mode: drop `mode`, or `permits` for a read lock",
                    ));
                }
                Some(n)
            }
            None => None,
        };
        let mode = match mode.as_ref().map(|m| (m.value(), m.span())) {
            None => Mode::Write,
            Some((m, _)) if m == "write" => Mode::Write,
            Some((m, _)) if m == "read" => Mode::Read,
            Some((m, span)) => {
                return Err(syn::Error::new(
                    span,
                    format!("unknown mode \"{m}\": use \"write\" or \"read\""),
                ));
            }
        };
        let cancel_on_lost = match on_lost.as_ref().map(|o| (o.value(), o.span())) {
            None => mode == Mode::Write || job.hold_at_most.is_some(),
            Some((o, _)) if o == "cancel" => true,
            Some((o, _)) if o == "ignore" => false,
            Some((o, span)) => {
                return Err(syn::Error::new(
                    span,
                    format!("unknown on_lost \"{o}\": use \"cancel\" or \"ignore\""),
                ));
            }
        };
        let cancel_on_revoke = match on_revoke.as_ref().map(|o| (o.value(), o.span())) {
            None => false,
            Some((o, _)) if o == "cancel" => true,
            Some((o, _)) if o == "notify" => false,
            Some((o, span)) => {
                return Err(syn::Error::new(
                    span,
                    format!("unknown on_revoke \"{o}\": use \"cancel\" or \"notify\""),
                ));
            }
        };
        let lease = match lease {
            Some(lit) => {
                let lease = duration(&lit)?;
                if lease < MIN_LEASE {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!("lease \"{}\" is too short: use at least 30ms", lit.value()),
                    ));
                }
                Some(lease)
            }
            None => None,
        };
        if let Some(engine) = &engine
            && engine.value().is_empty()
        {
            return Err(syn::Error::new(
                engine.span(),
                "`engine` is empty; name an engine from the config",
            ));
        }
        Ok(Args {
            group,
            keys,
            permits,
            mode,
            wait: wait.map(|w| duration(&w)).transpose()?,
            lease,
            engine,
            cancel_on_lost,
            cancel_on_revoke,
            job,
        })
    }
}

/// Checks a run-once job's options: `if_held` is "skip" or "wait", the
/// holds are durations, and at least comes no later than at most.
fn job(
    if_held: &Option<LitStr>,
    hold_at_least: &Option<LitStr>,
    hold_at_most: &Option<LitStr>,
) -> syn::Result<Job> {
    let skip = match if_held.as_ref().map(|o| (o.value(), o.span())) {
        None => None,
        Some((o, span)) if o == "skip" => Some(span),
        Some((o, _)) if o == "wait" => None,
        Some((o, span)) => {
            return Err(syn::Error::new(
                span,
                format!("unknown if_held \"{o}\": use \"skip\" (a run-once job) or \"wait\""),
            ));
        }
    };
    let at_least = hold_at_least.as_ref().map(duration).transpose()?;
    let at_most = hold_at_most.as_ref().map(duration).transpose()?;
    if let (Some(least), Some(most), Some(lit)) = (at_least, at_most, hold_at_least)
        && least > most
    {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "hold_at_least \"{}\" is longer than hold_at_most: the hold ends at the latter",
                lit.value()
            ),
        ));
    }
    let span = skip.or_else(|| {
        [hold_at_least, hold_at_most]
            .into_iter()
            .flatten()
            .map(LitStr::span)
            .next()
    });
    Ok(Job {
        skip,
        hold_at_least: at_least,
        hold_at_most: at_most,
        span,
    })
}

fn duration(lit: &LitStr) -> syn::Result<Duration> {
    humantime::parse_duration(&lit.value()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "bad duration \"{}\": {e}; write e.g. \"250ms\", \"5s\", \"1m\"",
                lit.value()
            ),
        )
    })
}

fn unknown_option(option: &str) -> String {
    let names = OPTIONS.iter().map(|spec| spec.name);
    let hint = match nearest(option, names.clone()) {
        Some(nearest) => format!("did you mean `{nearest}`? "),
        None => String::new(),
    };
    format!(
        "unknown option `{option}`; {hint}options are: {}",
        names.collect::<Vec<_>>().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::OPTIONS;

    /// The rustdoc table of `distributed_lock` lists the options of
    /// [`OPTIONS`], in its order.
    #[test]
    fn the_docs_list_every_option_in_order() {
        let documented: Vec<&str> = include_str!("lib.rs")
            .lines()
            .filter_map(|line| line.trim().strip_prefix("/// | `")?.split_once('`'))
            .map(|(name, _)| name)
            .collect();
        let options: Vec<&str> = OPTIONS.iter().map(|spec| spec.name).collect();
        assert_eq!(documented, options);
    }
}
