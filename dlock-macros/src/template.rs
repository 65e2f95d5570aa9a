//! Key templates: literal text with `<param>` and `<param.field.path>` parts,
//! each part formatted with `Display`.

use syn::LitStr;

pub(crate) struct Template {
    /// The literal as written: errors about the template point here.
    pub lit: LitStr,
    pub parts: Vec<Part>,
}

pub(crate) enum Part {
    Text(String),
    /// `root.path...`: a parameter (or `self`) and a field path into it.
    Field {
        root: String,
        path: Vec<String>,
    },
}

impl Template {
    pub fn parse(lit: LitStr) -> syn::Result<Self> {
        let text = lit.value();
        let error = |message: String| syn::Error::new(lit.span(), message);
        if text.is_empty() {
            return Err(error(
                "`key` is empty; write text and <param> parts, e.g. \"<order_id>\"".into(),
            ));
        }
        let mut parts = Vec::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(['<', '>']) {
            if rest[at..].starts_with('>') {
                return Err(error(format!("`>` without a matching `<` in key \"{text}\"")));
            }
            if at > 0 {
                parts.push(Part::Text(rest[..at].to_owned()));
            }
            let after = &rest[at + 1..];
            let end = after
                .find(['<', '>'])
                .filter(|&end| after[end..].starts_with('>'))
                .ok_or_else(|| error(format!("unclosed `<` in key \"{text}\": write <param>")))?;
            parts.push(field(&after[..end]).map_err(error)?);
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Template { lit, parts })
    }
}

fn field(inside: &str) -> Result<Part, String> {
    if inside.trim().is_empty() {
        return Err("`<>` names nothing: write <param> or <param.field>".into());
    }
    let mut segments = inside.split('.').map(str::trim);
    let root = segments.next().expect("split yields one segment").to_owned();
    if !is_ident(&root) {
        return Err(format!("`<{inside}>`: `{root}` is not a parameter name"));
    }
    let path: Vec<String> = segments.map(str::to_owned).collect();
    if let Some(bad) = path.iter().find(|s| !is_ident(s) && s.parse::<u32>().is_err()) {
        return Err(format!(
            "`<{inside}>`: `{bad}` is not a field name or tuple index"
        ));
    }
    Ok(Part::Field { root, path })
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}
