//! Turns the checked arguments and the function into tokens. The signature,
//! visibility, attributes and docs are kept; generated paths go through
//! `::dlock::__private` only.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Expr, FnArg, ItemFn, Meta, ReturnType, Stmt, Type};

use crate::attr::{Args, Mode};
use crate::suggest::nearest;
use crate::template::{Part, Template};

pub(crate) fn expand(first: Args, mut item: ItemFn) -> syn::Result<TokenStream> {
    // Further `#[distributed_lock]`s on this fn expand here too, so all its
    // locks are taken as one set (left alone, each would wrap the next).
    let mut locks = vec![first];
    let mut kept = Vec::new();
    for attr in std::mem::take(&mut item.attrs) {
        if is_ours(&attr) {
            locks.push(parse_attr(&attr)?);
        } else {
            kept.push(attr);
        }
    }
    item.attrs = kept;

    if (locks.len() > 1 || locks[0].keys.len() > 1)
        && let Some(span) = locks.iter().find_map(|args| args.job.span)
    {
        return Err(syn::Error::new(
            span,
            "a run-once job takes one lock: give one `key`, and one #[distributed_lock]",
        ));
    }
    let skips = locks[0].job.skip.is_some();
    // That the output is a `Result` whose error converts from `dlock::Error`
    // is checked by the compiler, at the return type, through `Outcome`
    // (`JobOutcome` for a job that skips).
    let (body, ret) = split_body(&item, skips)?;
    let params = params(&item);
    let fn_name = item.sig.ident.to_string();
    for args in &locks {
        for template in &args.keys {
            check_roots(template, &params, &fn_name)?;
        }
    }

    let sites = locks.iter().enumerate().map(|(i, args)| site(i, args));
    // One (site, key) pair per lock: an attribute without keys names its
    // lock after the function.
    let pairs: Vec<(usize, Option<&Template>)> = locks
        .iter()
        .enumerate()
        .flat_map(|(i, args)| match args.keys.as_slice() {
            [] => vec![(i, None)],
            keys => keys.iter().map(|key| (i, Some(key))).collect(),
        })
        .collect();
    let names = pairs.iter().enumerate().map(|(j, (_, key))| {
        let name = name_ident(j);
        let rendered = render(*key, &fn_name);
        quote!(let #name = ::dlock::__private::render(#rendered);)
    });
    let future = body.future;
    let future = match pairs.as_slice() {
        [(i, _)] => {
            let (site, name) = (site_ident(*i), name_ident(0));
            let run = match skips {
                true => quote!(run_job),
                false => quote!(run),
            };
            quote_spanned!(ret.span()=> ::dlock::__private::#run(&#site, #name, #future))
        }
        _ => {
            let each = pairs.iter().enumerate().map(|(j, (i, _))| {
                let (site, name) = (site_ident(*i), name_ident(j));
                quote!((&#site, #name))
            });
            quote_spanned!(ret.span()=> ::dlock::__private::run_all([#(#each),*], #future))
        }
    };
    let ItemFn { attrs, vis, sig, .. } = &item;
    // Spanned at the return type, like `run`: a wrong output type is one error, there.
    let awaited = quote_spanned!(ret.span()=> #future.await);
    let run = match body.kind {
        Kind::AsyncFn => awaited,
        Kind::AsyncTrait => quote!(::std::boxed::Box::pin(async move { #awaited })),
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #(#sites)*
            #(#names)*
            #run
        }
    })
}

fn is_ours(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "distributed_lock")
}

fn parse_attr(attr: &Attribute) -> syn::Result<Args> {
    match &attr.meta {
        Meta::List(list) => Args::parse(list.tokens.clone(), attr.span()),
        Meta::Path(_) => Args::parse(TokenStream::new(), attr.span()),
        Meta::NameValue(nv) => Err(syn::Error::new_spanned(
            nv,
            "write #[distributed_lock(group = \"...\", ...)]",
        )),
    }
}

enum Kind {
    AsyncFn,
    /// A method already rewritten by `#[async_trait]`: `Box::pin(async move { .. })`.
    AsyncTrait,
}

struct Body {
    kind: Kind,
    /// The body as a future of the function's output.
    future: TokenStream,
}

/// The body as a future, and the type it resolves to; for a job that
/// skips, the body resolves to the `Result<T, E>` of a `Result<Ran<T>, E>`.
fn split_body(item: &ItemFn, skips: bool) -> syn::Result<(Body, Type)> {
    let sig = &item.sig;
    if sig.asyncness.is_some() {
        let ReturnType::Type(_, ret) = &sig.output else {
            return Err(syn::Error::new(
                sig.ident.span(),
                "#[distributed_lock] needs the function to return `Result<T, E>` with `E: From<dlock::Error>`; \
                 this one returns `()`",
            ));
        };
        let mut pinned = (**ret).clone();
        InferImplTrait.visit_type_mut(&mut pinned);
        let pinned = match skips {
            true => quote_spanned!(ret.span()=> <#pinned as ::dlock::__private::JobOutcome>::Body),
            false => quote!(#pinned),
        };
        let stmts = &item.block.stmts;
        // The first statement fixes the block's output type, so `?` in the
        // body converts to the function's error type (as async-trait does).
        let future = quote! {
            async move {
                if let ::core::option::Option::Some(__dlock_ret) = ::core::option::Option::None::<#pinned> {
                    #[allow(unreachable_code)]
                    return __dlock_ret;
                }
                #(#stmts)*
            }
        };
        return Ok((
            Body {
                kind: Kind::AsyncFn,
                future,
            },
            (**ret).clone(),
        ));
    }
    if let Some(block) = async_trait_block(item) {
        if skips {
            return Err(syn::Error::new(
                sig.ident.span(),
                "`if_held = \"skip\"` works on an `async fn` outside `#[async_trait]`: call one from the method",
            ));
        }
        let mut output = FutureOutput(None);
        output.visit_return_type(&sig.output);
        if let Some(ret) = output.0 {
            let future = quote!(#block);
            return Ok((
                Body {
                    kind: Kind::AsyncTrait,
                    future,
                },
                ret,
            ));
        }
    }
    Err(syn::Error::new(
        sig.fn_token.span,
        "#[distributed_lock] works on `async fn` only: taking a distributed lock waits on the network",
    ))
}

/// The `async move { .. }` inside `#[async_trait]`'s `Box::pin(..)`.
fn async_trait_block(item: &ItemFn) -> Option<&Expr> {
    let [Stmt::Expr(Expr::Call(call), None)] = item.block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let is_pin = func.path.segments.last().is_some_and(|s| s.ident == "pin");
    match call.args.first() {
        Some(block @ Expr::Async(_)) if is_pin && call.args.len() == 1 => Some(block),
        _ => None,
    }
}

/// Finds `Output = T` in `Pin<Box<dyn Future<Output = T> + ..>>`.
struct FutureOutput(Option<Type>);

impl<'a> Visit<'a> for FutureOutput {
    fn visit_assoc_type(&mut self, assoc: &'a syn::AssocType) {
        if assoc.ident == "Output" && self.0.is_none() {
            self.0 = Some(assoc.ty.clone());
        }
    }
}

/// `impl Trait` cannot name a type in expression position; `_` can.
struct InferImplTrait;

impl VisitMut for InferImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(it) = ty {
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: syn::Token![_](it.span()),
            });
        } else {
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
}

/// The names a key may start from: `self`, and every name the parameters
/// bind, inside patterns too (`Path(id): Path<u64>` gives `id`).
fn params(item: &ItemFn) -> Vec<String> {
    struct Bound(Vec<String>);
    impl<'a> syn::visit::Visit<'a> for Bound {
        fn visit_pat_ident(&mut self, p: &'a syn::PatIdent) {
            self.0.push(p.ident.to_string());
            syn::visit::visit_pat_ident(self, p);
        }
    }
    let mut bound = Bound(Vec::new());
    for input in &item.sig.inputs {
        match input {
            FnArg::Receiver(_) => bound.0.push("self".to_owned()),
            FnArg::Typed(typed) => syn::visit::Visit::visit_pat(&mut bound, &typed.pat),
        }
    }
    bound.0
}

fn check_roots(template: &Template, params: &[String], fn_name: &str) -> syn::Result<()> {
    for part in &template.parts {
        if let Part::Field { root, .. } = part
            && !params.contains(root)
        {
            let known = if params.is_empty() {
                format!("`{fn_name}` has no parameters")
            } else {
                format!("parameters of `{fn_name}`: {}", params.join(", "))
            };
            let hint = match nearest(root, params.iter().map(String::as_str)) {
                Some(param) => format!("did you mean `{param}`? "),
                None => String::new(),
            };
            return Err(syn::Error::new(
                template.lit.span(),
                format!("key names `<{root}>`, which is not a parameter; {hint}{known}"),
            ));
        }
    }
    Ok(())
}

/// `format_args!` for the key: text with braces escaped, one `{}` per part.
/// Expressions carry the literal's span, so a missing field or a type without
/// `Display` is reported at the key.
fn render(key: Option<&Template>, fn_name: &str) -> TokenStream {
    let Some(template) = key else {
        return quote!(::core::format_args!(#fn_name));
    };
    let span = template.lit.span();
    let mut format = String::new();
    let mut values = Vec::new();
    for part in &template.parts {
        match part {
            Part::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Part::Field { root, path } => {
                format.push_str("{}");
                let root = match root.as_str() {
                    "self" => quote_spanned!(span=> self),
                    other => {
                        let ident = syn::Ident::new(other, span);
                        quote!(#ident)
                    }
                };
                let path = path.iter().map(|segment| match segment.parse::<u32>() {
                    Ok(index) => {
                        let index = syn::Index { index, span };
                        quote!(.#index)
                    }
                    // Named from the macro, placed at the key: rustc then
                    // reports a missing field there without suggesting an
                    // edit of the key's text, which would break it.
                    Err(_) => {
                        let field = syn::Ident::new(segment, Span::mixed_site().located_at(span));
                        quote!(.#field)
                    }
                });
                values.push(quote_spanned!(span=> &#root #(#path)*));
            }
        }
    }
    quote_spanned!(span=> ::core::format_args!(#format, #(#values),*))
}

fn site(i: usize, args: &Args) -> TokenStream {
    let ident = site_ident(i);
    let group = &args.group;
    let engine = match &args.engine {
        Some(engine) => quote!(::core::option::Option::Some(#engine)),
        None => quote!(::core::option::Option::None),
    };
    let mode = match args.mode {
        Mode::Write => quote!(::dlock::__private::Mode::Write),
        Mode::Read => quote!(::dlock::__private::Mode::Read),
    };
    let duration = |d: Option<std::time::Duration>| match d {
        Some(d) => {
            let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
            quote!(::core::option::Option::Some(::core::time::Duration::new(#secs, #nanos)))
        }
        None => quote!(::core::option::Option::None),
    };
    let (wait, lease) = (duration(args.wait), duration(args.lease));
    let (on_lost, on_revoke) = (args.cancel_on_lost, args.cancel_on_revoke);
    let skip = args.job.skip.is_some();
    let (hold_at_least, hold_at_most) = (duration(args.job.hold_at_least), duration(args.job.hold_at_most));
    let permits = match args.permits {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    quote! {
        static #ident: ::dlock::__private::Site =
            ::dlock::__private::Site::new(#group, #engine, #permits, #mode, #wait, #lease,
                ::dlock::__private::Cancel { on_lost: #on_lost, on_revoke: #on_revoke },
                ::dlock::__private::Job { skip: #skip, hold_at_least: #hold_at_least, hold_at_most: #hold_at_most });
    }
}

/// Locals of the expansion, unreachable from the user's code (mixed-site hygiene).
fn site_ident(i: usize) -> syn::Ident {
    format_ident!("__DLOCK_SITE_{}", i, span = Span::mixed_site())
}

fn name_ident(i: usize) -> syn::Ident {
    format_ident!("__dlock_name_{}", i, span = Span::mixed_site())
}
