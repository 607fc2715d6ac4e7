//! Talos v1.14's disk CEL environment, `celenv.DiskLocator()`, as talboot checks and
//! evaluates it: which expressions Talos accepts (a static checker), what one says about a disk
//! (evaluation with the `cel` crate), and which disk Talos then picks (install and volume
//! rules), refusing what would leave the pick to chance. Everything here is pure.
//!
//! It sits in the base layer because two readers need it: the inventory compiles an
//! operator's own `diskSelector.match` when it loads (so a typo fails `check`, not the node),
//! and the provisioner evaluates every rendered expression against the disks a node reports
//! in maintenance mode before a config is applied.
//!
//! Facts, from siderolabs/talos v1.14.0-rc.1 (see `docs/design/cel-disk-selectors.md`):
//! * `pkg/machinery/cel/celenv/celenv.go` `DiskLocator`: the standard library and macros
//!   only (no string extensions, no optional syntax), `disk` of type `DiskSpec` (its 19 proto
//!   fields, [`CelDisk`]), `system_disk` (bool), `glob(string, string)` (ryanuber/go-glob: only
//!   `*` is special) and the unit constants `KiB`..`EiB`, `kB`..`EB`, all of type `uint`.
//! * `pkg/machinery/cel/cel.go` `ParseBooleanExpression`: parse, then cel-go's type checker,
//!   then the result must be `bool`. The `cel` crate has no checker, so [`Checker`] is
//!   talboot's: cel-go's overloads for equality and arithmetic are homogeneous (`uint == int`
//!   and `10 * GiB` are check errors) while ordering mixes numeric types.
//! * `has(disk.f)` on the proto3 message is true only for a non-zero field; the crate would
//!   see a map key, so [`compile`] rewrites it into the zero comparison.
//! * Install (`controllers/runtime/unattended_install.go`, `blockhelpers.MatchDisks`): every
//!   disk in resource-ID order, `system_disk` false, the first match wins, none waits forever.
//! * Volumes (`controllers/block/internal/volumes/locate.go`): read-only disks skipped,
//!   `system_disk` bound to "is the install disk", a `disk` volume refuses several matches,
//!   a partition goes to the first candidate with room (`minSize` + 67 sectors on a blank disk).

use std::fmt;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, LiteralValue, SelectExpr, operators};
use cel::common::types::{CelBool, CelInt, CelString, CelUInt, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{Context, Env, ExecutionError, Value};

/// The unit constants `DiskLocator` declares, all `uint` (`celenv.go`, `unitConstants`).
pub const UNITS: [(&str, u64); 12] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("PiB", 1 << 50),
    ("EiB", 1 << 60),
    ("kB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("PB", 1_000_000_000_000_000),
    ("EB", 1_000_000_000_000_000_000),
];

/// One disk as the `disk` variable holds it: `talos.resource.definitions.block.DiskSpec`
/// (`api/resource/definitions/block/block.proto`, v1.14), field for field under the proto
/// names cel-go uses. A field the node did not report is its zero value, as in proto3.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CelDisk {
    pub size: u64,
    pub io_size: u64,
    pub sector_size: u64,
    pub readonly: bool,
    pub model: String,
    pub serial: String,
    pub modalias: String,
    pub wwid: String,
    pub bus_path: String,
    pub sub_system: String,
    pub transport: String,
    pub rotational: bool,
    pub cdrom: bool,
    pub dev_path: String,
    pub pretty_size: String,
    pub secondary_disks: Vec<String>,
    pub uuid: String,
    pub symlinks: Vec<String>,
    pub firmware_version: String,
}

/// The proto type of a `DiskSpec` field, which decides both checking and `has()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    U64,
    Bool,
    Str,
    Strs,
}

/// `DiskSpec`'s fields (block.proto 1..19).
const DISK_FIELDS: [(&str, Field); 19] = [
    ("size", Field::U64),
    ("io_size", Field::U64),
    ("sector_size", Field::U64),
    ("readonly", Field::Bool),
    ("model", Field::Str),
    ("serial", Field::Str),
    ("modalias", Field::Str),
    ("wwid", Field::Str),
    ("bus_path", Field::Str),
    ("sub_system", Field::Str),
    ("transport", Field::Str),
    ("rotational", Field::Bool),
    ("cdrom", Field::Bool),
    ("dev_path", Field::Str),
    ("pretty_size", Field::Str),
    ("secondary_disks", Field::Strs),
    ("uuid", Field::Str),
    ("symlinks", Field::Strs),
    ("firmware_version", Field::Str),
];

const DISK_TYPE: &str = "talos.resource.definitions.block.DiskSpec";

fn disk_field(name: &str) -> Option<Field> {
    DISK_FIELDS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

/// Why an expression is not one Talos accepts, or could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// Not CEL syntax (or syntax Talos's environment leaves out, such as `.?`).
    #[error("does not parse: {0}")]
    Parse(String),
    /// Parses, but Talos's type checker refuses it (what `ParseBooleanExpression` reports
    /// when the config is applied).
    #[error("Talos would refuse it: {0}")]
    Check(String),
    /// Evaluation failed (an overflow, a bad regular expression, an unbound `system_disk`).
    #[error("evaluation failed: {0}")]
    Eval(String),
}

/// A checked disk expression, ready to evaluate.
#[derive(Clone, Debug)]
pub struct DiskExpr {
    text: String,
    ast: IdedExpr,
}

impl DiskExpr {
    /// The expression as written (and rendered into the config).
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for DiskExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The crate's environment for Talos's: the standard library without optional values, plus
/// `glob`. Built once; evaluation only reads it.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::default().with_optional_support(false).with_stdlib();
    env.add_overload(
        "glob",
        "glob_string_string",
        vec![STRING_TYPE, STRING_TYPE],
        glob_fn,
    )
    .expect("glob is declared once");
    Arc::new(env)
});

/// The standard macros, expanded the way the crate's `Env::stdlib` parser expands them.
static PARSER_ENV: LazyLock<Env> = LazyLock::new(|| Env::stdlib().with_optional_support(false));

fn glob_fn<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = |i: usize| {
        args.get(i)
            .and_then(|a| a.downcast_ref::<CelString>())
            .map(|s| s.inner().to_owned())
    };
    match (text(0), text(1)) {
        (Some(p), Some(s)) => Ok(CowVal::owned(CelBool::from(go_glob(&p, &s)))),
        _ => Err(ExecutionError::function_error(
            "glob",
            "expects (string, string)",
        )),
    }
}

/// ryanuber/go-glob v1.0.0 `Glob`: only `*` is special; everything else, `[`, `?` and `\`
/// included, matches itself.
pub fn go_glob(pattern: &str, subj: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return subj == pattern;
    }
    let leading = pattern.starts_with('*');
    let trailing = pattern.ends_with('*');
    let end = parts.len() - 1;
    let mut rest = subj;
    for (i, part) in parts[..end].iter().enumerate() {
        let Some(idx) = rest.find(part) else {
            return false;
        };
        // The first part must be a prefix unless the pattern starts with `*`.
        if i == 0 && !leading && idx != 0 {
            return false;
        }
        rest = &rest[idx + part.len()..];
    }
    trailing || rest.ends_with(parts[end])
}

/// Parses, checks and prepares `text` for evaluation in Talos's disk environment.
pub fn compile(text: &str) -> Result<DiskExpr, CelError> {
    compile_with(text, Checker::default())
}

/// [`compile`] for a `RAIDArrayConfig` member selector: Talos checks it in the
/// `VolumeLocator` environment (no `system_disk`, no `glob`); talboot accepts the part of it
/// that tests `disk` only, which evaluates the same against the disks a node reports.
pub fn compile_member(text: &str) -> Result<DiskExpr, CelError> {
    compile_with(
        text,
        Checker {
            member: true,
            ..Checker::default()
        },
    )
}

fn compile_with(text: &str, mut checker: Checker) -> Result<DiskExpr, CelError> {
    if text.trim().is_empty() {
        return Err(CelError::Parse("the expression is empty".into()));
    }
    let ast = PARSER_ENV
        .parser()
        .parse(text)
        .map_err(|e| CelError::Parse(e.to_string().trim().to_owned()))?;
    let ty = checker.check(&ast)?;
    if ty != Ty::Bool {
        return Err(CelError::Check(format!(
            "the expression is of type {ty}, not bool"
        )));
    }
    Ok(DiskExpr {
        text: text.to_owned(),
        ast: rewrite_has(ast),
    })
}

/// Evaluates `expr` for one disk. `system_disk` is `None` where Talos leaves it unbound
/// (volumes before a system disk exists), which makes any reference to it an error.
pub fn eval(expr: &DiskExpr, disk: &CelDisk, system_disk: Option<bool>) -> Result<bool, CelError> {
    let mut ctx = Context::with_env(Arc::clone(&ENV));
    ctx.add_variable("disk", disk)
        .map_err(|e| CelError::Eval(e.to_string()))?;
    if let Some(s) = system_disk {
        ctx.add_variable_from_value("system_disk", Value::Bool(s));
    }
    for (name, v) in UNITS {
        ctx.add_variable_from_value(name, Value::UInt(v));
    }
    match Value::resolve(&expr.ast, &ctx) {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(other) => Err(CelError::Eval(format!(
            "the result is {other:?}, not a bool"
        ))),
        Err(e) => Err(CelError::Eval(e.to_string())),
    }
}

// ---------------------------------------------------------------------------------------
// The checker.

/// The types the checker tracks: cel-go's, with `dyn` as "any" (the result of `dyn()`, of an
/// empty list's elements and of a mixed literal, which cel-go types as `dyn` too).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    UInt,
    Double,
    Str,
    Bytes,
    Null,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Disk,
    Dyn,
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::UInt => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::Str => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Null => f.write_str("null_type"),
            Ty::List(t) => write!(f, "list({t})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Disk => f.write_str(DISK_TYPE),
            Ty::Dyn => f.write_str("dyn"),
        }
    }
}

impl Ty {
    fn of_field(f: Field) -> Ty {
        match f {
            Field::U64 => Ty::UInt,
            Field::Bool => Ty::Bool,
            Field::Str => Ty::Str,
            Field::Strs => Ty::List(Box::new(Ty::Str)),
        }
    }

    /// `self` is `want` or `dyn`.
    fn is(&self, want: &Ty) -> bool {
        self == want || *self == Ty::Dyn
    }

    fn is_number(&self) -> bool {
        matches!(self, Ty::Int | Ty::UInt | Ty::Double | Ty::Dyn)
    }
}

/// The common type of `a` and `b` under cel-go's homogeneous overloads, `dyn` giving way.
fn unify(a: &Ty, b: &Ty) -> Option<Ty> {
    match (a, b) {
        _ if a == b => Some(a.clone()),
        (Ty::Dyn, t) | (t, Ty::Dyn) => Some(t.clone()),
        (Ty::List(x), Ty::List(y)) => Some(Ty::List(Box::new(unify(x, y)?))),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => {
            Some(Ty::Map(Box::new(unify(k1, k2)?), Box::new(unify(v1, v2)?)))
        }
        _ => None,
    }
}

/// A type checker for Talos's `DiskLocator` environment over the crate's AST.
#[derive(Default)]
struct Checker {
    /// Comprehension variables in scope, innermost last.
    scopes: Vec<(String, Ty)>,
    /// Checking a RAID member selector: Talos's `VolumeLocator` environment, which declares
    /// neither `system_disk` nor `glob`; talboot also leaves out its `volume` variable.
    member: bool,
}

fn check_err(why: impl Into<String>) -> CelError {
    CelError::Check(why.into())
}

/// Functions the standard library declares (and `glob`); any other name is undeclared.
const KNOWN_FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "glob",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "dyn",
];

impl Checker {
    fn check(&mut self, e: &IdedExpr) -> Result<Ty, CelError> {
        match &e.expr {
            Expr::Unspecified => Err(check_err("an empty expression")),
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::Null => Ty::Null,
                LiteralValue::String(_) => Ty::Str,
                LiteralValue::UInt(_) => Ty::UInt,
            }),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(s) => self.select(s),
            Expr::Call(c) => self.call(c),
            Expr::List(l) => {
                if !l.optional_indices.is_empty() {
                    return Err(check_err("optional list elements are not enabled"));
                }
                let mut elem: Option<Ty> = None;
                for el in &l.elements {
                    let t = self.check(el)?;
                    elem = Some(match elem {
                        None => t,
                        Some(prev) => unify(&prev, &t).unwrap_or(Ty::Dyn),
                    });
                }
                Ok(Ty::List(Box::new(elem.unwrap_or(Ty::Dyn))))
            }
            Expr::Map(m) => {
                let (mut key, mut val): (Option<Ty>, Option<Ty>) = (None, None);
                for entry in &m.entries {
                    let EntryExpr::MapEntry(me) = &entry.expr else {
                        return Err(check_err("a field initialiser outside a message literal"));
                    };
                    if me.optional {
                        return Err(check_err("optional map entries are not enabled"));
                    }
                    let k = self.check(&me.key)?;
                    if !matches!(k, Ty::Int | Ty::UInt | Ty::Str | Ty::Bool | Ty::Dyn) {
                        return Err(check_err(format!("a map key cannot be of type {k}")));
                    }
                    let v = self.check(&me.value)?;
                    key = Some(key.map_or(k.clone(), |p| unify(&p, &k).unwrap_or(Ty::Dyn)));
                    val = Some(val.map_or(v.clone(), |p| unify(&p, &v).unwrap_or(Ty::Dyn)));
                }
                Ok(Ty::Map(
                    Box::new(key.unwrap_or(Ty::Dyn)),
                    Box::new(val.unwrap_or(Ty::Dyn)),
                ))
            }
            Expr::Struct(s) => Err(check_err(format!(
                "message literal {}{{...}}: talboot does not accept message literals in disk \
                 selectors",
                s.type_name
            ))),
            Expr::Comprehension(c) => {
                if c.iter_var2.is_some() {
                    return Err(check_err("two-variable comprehensions are not enabled"));
                }
                let elem = match self.check(&c.iter_range)? {
                    Ty::List(t) => *t,
                    Ty::Map(k, _) => *k,
                    Ty::Dyn => Ty::Dyn,
                    other => {
                        return Err(check_err(format!(
                            "expression of type {other} cannot be range of a comprehension"
                        )));
                    }
                };
                let accu = self.check(&c.accu_init)?;
                self.scopes.push((c.iter_var.clone(), elem));
                self.scopes.push((c.accu_var.clone(), accu.clone()));
                let checked = self.comprehension_body(c, &accu);
                self.scopes.truncate(self.scopes.len() - 2);
                checked
            }
        }
    }

    /// The loop condition, step and result of a comprehension whose variables are in scope.
    fn comprehension_body(
        &mut self,
        c: &cel::common::ast::ComprehensionExpr,
        accu: &Ty,
    ) -> Result<Ty, CelError> {
        let cond = self.check(&c.loop_cond)?;
        if !cond.is(&Ty::Bool) {
            return Err(check_err(format!(
                "a macro's condition is of type {cond}, not bool"
            )));
        }
        let step = self.check(&c.loop_step)?;
        let refined = unify(accu, &step)
            .ok_or_else(|| check_err(format!("a macro's step is of type {step}, not {accu}")))?;
        if let Some(last) = self.scopes.last_mut() {
            last.1 = refined;
        }
        self.check(&c.result)
    }

    fn ident(&self, name: &str) -> Result<Ty, CelError> {
        if let Some((_, t)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Ok(t.clone());
        }
        match name {
            "disk" => Ok(Ty::Disk),
            "system_disk" | "volume" if self.member => Err(check_err(format!(
                "undeclared reference to '{name}' (a RAID member selector is checked in \
                 Talos's VolumeLocator environment, which has no system_disk; talboot \
                 accepts only disk there, since it checks members against the node's disks)"
            ))),
            "system_disk" => Ok(Ty::Bool),
            _ if UNITS.iter().any(|(u, _)| *u == name) => Ok(Ty::UInt),
            _ => Err(check_err(format!(
                "undeclared reference to '{name}' (the disk environment declares disk, \
                 system_disk and the units KiB..EiB, kB..EB)"
            ))),
        }
    }

    fn select(&mut self, s: &SelectExpr) -> Result<Ty, CelError> {
        let operand = self.check(&s.operand)?;
        let field = match &operand {
            Ty::Disk => Ty::of_field(disk_field(&s.field).ok_or_else(|| {
                check_err(format!(
                    "undefined field '{}' of {DISK_TYPE} (its fields: {})",
                    s.field,
                    DISK_FIELDS.map(|(n, _)| n).join(", ")
                ))
            })?),
            Ty::Map(k, v) if k.is(&Ty::Str) => (**v).clone(),
            Ty::Dyn => Ty::Dyn,
            other => {
                return Err(check_err(format!(
                    "type '{other}' does not support field selection"
                )));
            }
        };
        Ok(if s.test { Ty::Bool } else { field })
    }

    fn call(&mut self, c: &CallExpr) -> Result<Ty, CelError> {
        let target = match &c.target {
            Some(t) => Some(self.check(t)?),
            None => None,
        };
        let args = c
            .args
            .iter()
            .map(|a| self.check(a))
            .collect::<Result<Vec<_>, _>>()?;
        let name = c.func_name.as_str();
        if self.member && name == "glob" {
            return Err(check_err(
                "undeclared reference to 'glob' (Talos's VolumeLocator environment, where \
                 RAID member selectors are checked, has no glob; use startsWith, endsWith, \
                 contains or matches)",
            ));
        }
        let found = overload(name, target.as_ref(), &args);
        found.ok_or_else(|| {
            if !name.starts_with('_')
                && !name.starts_with('@')
                && !name.starts_with('!')
                && !name.starts_with('-')
                && !KNOWN_FUNCTIONS.contains(&name)
            {
                return check_err(format!(
                    "undeclared reference to '{name}' (Talos's disk environment has the CEL \
                     standard library and glob only, no string extensions)"
                ));
            }
            let mut sig: Vec<String> = args.iter().map(ToString::to_string).collect();
            if let Some(t) = &target {
                sig.insert(0, t.to_string());
            }
            check_err(format!(
                "found no matching overload for '{name}' applied to '({})'",
                sig.join(", ")
            ))
        })
    }
}

/// The result type of `name` called on `target` with `args`, if the environment declares
/// such an overload (cel-go `common/stdlib/standard.go`, plus `glob`).
fn overload(name: &str, target: Option<&Ty>, args: &[Ty]) -> Option<Ty> {
    use operators as op;
    let (b, s) = (&Ty::Bool, &Ty::Str);
    let t = match (name, target, args) {
        (op::LOGICAL_AND | op::LOGICAL_OR, None, [x, y]) if x.is(b) && y.is(b) => Ty::Bool,
        (op::LOGICAL_NOT | op::NOT_STRICTLY_FALSE, None, [x]) if x.is(b) => Ty::Bool,
        (op::NEGATE, None, [x]) if matches!(x, Ty::Int | Ty::Double | Ty::Dyn) => x.clone(),
        (op::EQUALS | op::NOT_EQUALS, None, [x, y]) => {
            unify(x, y)?;
            Ty::Bool
        }
        (op::LESS | op::LESS_EQUALS | op::GREATER | op::GREATER_EQUALS, None, [x, y]) => {
            let numbers = x.is_number() && y.is_number();
            let same =
                unify(x, y).is_some_and(|t| matches!(t, Ty::Str | Ty::Bytes | Ty::Bool | Ty::Dyn));
            if !(numbers || same) {
                return None;
            }
            Ty::Bool
        }
        (op::ADD, None, [x, y]) => {
            let t = unify(x, y)?;
            if !(t.is_number() || matches!(t, Ty::Str | Ty::Bytes | Ty::List(_))) {
                return None;
            }
            t
        }
        (op::SUBSTRACT | op::MULTIPLY | op::DIVIDE, None, [x, y]) => {
            unify(x, y).filter(Ty::is_number)?
        }
        (op::MODULO, None, [x, y]) => {
            unify(x, y).filter(|t| matches!(t, Ty::Int | Ty::UInt | Ty::Dyn))?
        }
        (op::CONDITIONAL, None, [c, x, y]) if c.is(b) => unify(x, y)?,
        (op::INDEX, None, [coll, i]) => match coll {
            Ty::List(e) if matches!(i, Ty::Int | Ty::UInt | Ty::Dyn) => (**e).clone(),
            Ty::Map(k, v) if unify(k, i).is_some() => (**v).clone(),
            Ty::Dyn => Ty::Dyn,
            _ => return None,
        },
        (op::IN, None, [x, coll]) => match coll {
            Ty::List(e) if unify(x, e).is_some() => Ty::Bool,
            Ty::Map(k, _) if unify(x, k).is_some() => Ty::Bool,
            Ty::Dyn => Ty::Bool,
            _ => return None,
        },
        ("size", None, [x]) | ("size", Some(x), [])
            if matches!(x, Ty::Str | Ty::Bytes | Ty::List(_) | Ty::Map(..) | Ty::Dyn) =>
        {
            Ty::Int
        }
        ("contains" | "startsWith" | "endsWith", Some(x), [y]) if x.is(s) && y.is(s) => Ty::Bool,
        ("matches", None, [x, y]) | ("matches", Some(x), [y]) if x.is(s) && y.is(s) => Ty::Bool,
        ("glob", None, [x, y]) if x.is(s) && y.is(s) => Ty::Bool,
        ("int", None, [x]) if x.is_number() || *x == Ty::Str => Ty::Int,
        ("uint", None, [x]) if x.is_number() || *x == Ty::Str => Ty::UInt,
        ("double", None, [x]) if x.is_number() || *x == Ty::Str => Ty::Double,
        ("string", None, [x]) if x.is_number() || matches!(x, Ty::Str | Ty::Bool | Ty::Bytes) => {
            Ty::Str
        }
        ("bool", None, [x]) if x.is(b) || *x == Ty::Str => Ty::Bool,
        ("bytes", None, [Ty::Str | Ty::Bytes | Ty::Dyn]) => Ty::Bytes,
        ("dyn", None, [_]) => Ty::Dyn,
        _ => return None,
    };
    Some(t)
}

// ---------------------------------------------------------------------------------------
// The proto3 `has()` rewrite.

fn node(expr: Expr) -> IdedExpr {
    IdedExpr { id: 0, expr }
}

fn call(func: &str, args: Vec<IdedExpr>) -> IdedExpr {
    node(Expr::Call(CallExpr {
        func_name: func.to_owned(),
        target: None,
        args,
    }))
}

/// Replaces `has(disk.f)` by the proto3 presence test Talos evaluates: the field is not
/// its zero value (the crate would test for a map key, which is always there).
fn rewrite_has(mut e: IdedExpr) -> IdedExpr {
    e.expr = match e.expr {
        Expr::Select(s) if s.test && matches!(&s.operand.expr, Expr::Ident(n) if n == "disk") => {
            let field = s.field.clone();
            let get = node(Expr::Select(SelectExpr {
                operand: s.operand,
                field: field.clone(),
                test: false,
            }));
            return match disk_field(&field) {
                Some(Field::Bool) => get,
                Some(Field::U64) => call(
                    operators::NOT_EQUALS,
                    vec![
                        get,
                        node(Expr::Literal(LiteralValue::UInt(CelUInt::from(0u64)))),
                    ],
                ),
                Some(Field::Strs) => call(
                    operators::GREATER,
                    vec![
                        call("size", vec![get]),
                        node(Expr::Literal(LiteralValue::Int(CelInt::from(0i64)))),
                    ],
                ),
                Some(Field::Str) | None => call(
                    operators::NOT_EQUALS,
                    vec![
                        get,
                        node(Expr::Literal(LiteralValue::String(CelString::from(
                            String::new(),
                        )))),
                    ],
                ),
            };
        }
        Expr::Select(mut s) => {
            s.operand = Box::new(rewrite_has(*s.operand));
            Expr::Select(s)
        }
        Expr::Call(mut c) => {
            c.target = c.target.map(|t| Box::new(rewrite_has(*t)));
            c.args = c.args.into_iter().map(rewrite_has).collect();
            Expr::Call(c)
        }
        Expr::List(mut l) => {
            l.elements = l.elements.into_iter().map(rewrite_has).collect();
            Expr::List(l)
        }
        Expr::Comprehension(mut c) => {
            c.iter_range = rewrite_has(c.iter_range);
            c.accu_init = rewrite_has(c.accu_init);
            c.loop_cond = rewrite_has(c.loop_cond);
            c.loop_step = rewrite_has(c.loop_step);
            c.result = rewrite_has(c.result);
            Expr::Comprehension(c)
        }
        other => other,
    };
    e
}

mod pick;
mod raid;

pub use pick::{
    CelRefusal, Choice, Purpose, RefusalKind, choose, compile_for, describe, talos_order,
};
pub use raid::{choose_members, split_members};

#[cfg(test)]
mod tests;
