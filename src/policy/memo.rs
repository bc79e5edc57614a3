//! Judging each distinct situation once.
//!
//! Most registry rows differ only in identifiers (worker identity, session,
//! pid, start time) that the policies never inspect except by equality.
//! Cedar can observe a string value in exactly these ways: equality with
//! another value (`==`, `!=`, set membership), equality with a literal
//! written in a policy, and `like` patterns. A row's *situation key* keeps
//! every string that equals a policy literal or a string attribute of the
//! run entity, and replaces every other string by a placeholder numbered by
//! its first occurrence in the row, tagged with the `like` patterns it
//! matches and, when it is an element of some of the run's sets (the
//! lease-protected identities, sessions and pids), with which of them.
//! A `like` whose subject is `resource.A` can only ever see the string in
//! attribute `A`, so its bit is written at every occurrence in `A` and
//! nowhere else; a `like` on anything else is tested at every string's
//! first occurrence. Booleans are kept exactly. Every column name counts
//! as a literal, so the set of a row's blank columns is written as its
//! columns' bits: it says the same as its elements written out.
//!
//! Longs (a heartbeat's age in microseconds differs on every row) are kept
//! only as far as comparisons can tell them apart. Without arithmetic,
//! Cedar observes a Long only by comparing it (`<`, `<=`, `>`, `>=`, `==`,
//! `!=`, membership) with another Long: another attribute of the row, a
//! value of the run entity, or a literal of a policy (an `if … then … else`
//! only chooses which of those is compared). The key writes each Long as
//! its place among the policies' literals and the run's Longs (equal to
//! the i-th, or strictly between two neighbours) and, when between, its
//! rank among the row's own Longs in the same gap (ties equal). Two rows with the same places and ranks
//! are related by an order-preserving map that fixes every literal and run
//! value, so every comparison answers alike.
//!
//! Together: two rows with the same key are related by a renaming of
//! strings and an order-preserving map of Longs that preserve everything
//! the policies can observe, so Cedar's verdict for one is its verdict for
//! the other. The renaming fixes every literal and every string attribute
//! of the run, and moves each other string only within its class (the
//! strings in exactly the same run sets): each run set is mapped onto
//! itself, so the run entity is unchanged. Cedar cannot take an element out
//! of a set, so a run set's elements reach a `like` or an `==` only through
//! the row's own strings, whose classes and pattern bits the key writes.
//! (Were the run's set elements kept verbatim, as they once were, every
//! lease-protected row would be a situation of its own.) The argument
//! needs the policies to observe strings and Longs only in those ways and
//! to read the resource only through its attributes.
//! A policy set that does anything else (arithmetic on Longs, an extension
//! function, tags, the resource's own id) turns the memo off, and every row
//! is evaluated on its own.
//!
//! For one action the key keeps only the attributes that a policy which
//! can apply to it reads: the others cannot change its verdict. The first
//! stage's actions read a handful, so their rows share a few situations.

use crate::policy::entities::{all_column_names, Attr};
use crate::policy::Policies;
use crate::text::same_bytes;
use cedar_policy_core::ast::{
    self, BinaryOp, ExprKind, Literal, Pattern, PatternElem, UnaryOp, Var,
};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smol_str::SmolStr;

/// What a key knows of a string before it reads the row.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Known {
    /// A policy literal or a string attribute of the run: kept verbatim.
    Literal,
    /// An element of the run sets whose bits are set (bit `i`: the run's
    /// `i`-th set attribute), and no literal: a placeholder of that class.
    Member(u64),
}

/// What the policy set can observe about strings and Longs.
#[derive(Clone)]
pub struct Abstraction {
    /// The strings a key does not number plainly: policy literals and the
    /// run's string attributes (kept verbatim), and the elements of the
    /// run's sets (numbered within their class).
    known: KnownTable,
    /// Rules most of a row's strings out before the hash lookup.
    literal_filter: LiteralFilter,
    /// Long literals of the policies and Longs of the run, sorted, distinct.
    longs: Vec<i64>,
    /// Each `like` pattern with the one worker attribute it is applied to
    /// (`None`: its subject is something else, so it is tested everywhere).
    patterns: Vec<(Glob, Option<SmolStr>)>,
    disabled: Option<String>,
    /// When set, the only worker attributes the applicable policies read;
    /// the others cannot change a verdict and are left out of the key.
    reads: Option<HashSet<SmolStr>>,
    /// `reads` as a mask over the attribute list's positions (the entity
    /// builder always lists the same names in the same order), made at the
    /// first key.
    mask: std::sync::OnceLock<Vec<(&'static str, bool)>>,
}

/// What the run and the policies show a key must keep, gathered before
/// the [`Abstraction`] is built from it.
#[derive(Default)]
struct Observables {
    /// Policy literals and the run's string attributes (and column names).
    literals: HashSet<SmolStr>,
    /// Long literals of the policies and Longs of the run, as met.
    longs: Vec<i64>,
    /// Each run-set element: a bit for each run set that holds it.
    memberships: HashMap<SmolStr, u64>,
    /// Each `like` pattern with the worker attribute it is applied to.
    patterns: Vec<(Glob, Option<SmolStr>)>,
    /// Why the memo is off: the last thing met that it cannot abstract.
    disabled: Option<String>,
}

impl Observables {
    /// What the run entity's attributes contribute: its strings and Longs,
    /// and the classes of its sets' elements.
    fn of_run(run_attrs: &[(&'static str, Attr<'_>)]) -> Observables {
        let mut seen = Observables::default();
        let mut run_sets = 0usize;
        for (_, attr) in run_attrs {
            match attr {
                Attr::Long(n) => seen.longs.push(*n),
                Attr::Str(t) => {
                    seen.literals.insert(SmolStr::from(t.as_ref()));
                }
                Attr::Set(items) => {
                    for t in items {
                        let t = SmolStr::from(t.as_ref());
                        if run_sets < 64 {
                            *seen.memberships.entry(t).or_default() |= 1 << run_sets;
                        } else {
                            // Sets past the 64th (the run has three) keep
                            // their elements verbatim.
                            seen.literals.insert(t);
                        }
                    }
                    run_sets += 1;
                }
                // Column names are all literals (added by the caller).
                Attr::Columns(_) | Attr::Bool(_) => {}
            }
        }
        seen
    }

    /// Read one policy's condition: its literals and patterns, and anything
    /// that turns the memo off.
    fn scan(&mut self, policy: &ast::Policy) {
        let condition = policy.condition();
        let mut resource_uses = 0usize;
        let mut resource_attribute_uses = 0usize;
        for e in condition.subexpressions() {
            self.note(policy, e);
            let (uses, attribute_uses) = resource_use(e);
            resource_uses += uses;
            resource_attribute_uses += attribute_uses;
        }
        if resource_uses > resource_attribute_uses {
            self.disabled = Some(format!(
                "policy {} uses the resource other than through its attributes",
                policy.id()
            ));
        }
    }

    /// Note what one subexpression of `policy` shows: a literal, a `like`
    /// pattern, or a reason the memo cannot be used.
    fn note(&mut self, policy: &ast::Policy, e: &ast::Expr) {
        match e.expr_kind() {
            ExprKind::Lit(Literal::String(s)) => {
                self.literals.insert(s.clone());
            }
            ExprKind::Lit(Literal::Long(n)) => self.longs.push(*n),
            // `-5` may reach us as a negation of the literal 5.
            ExprKind::UnaryApp {
                op: UnaryOp::Neg,
                arg,
            } => match arg.expr_kind() {
                ExprKind::Lit(Literal::Long(n)) => {
                    self.longs.push(n.checked_neg().unwrap_or(i64::MIN))
                }
                _ => {
                    self.disabled = Some(format!("policy {} negates a Long", policy.id()));
                }
            },
            ExprKind::BinaryApp {
                op: BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul,
                ..
            } => {
                self.disabled = Some(format!("policy {} does arithmetic on Longs", policy.id()));
            }
            ExprKind::Lit(Literal::EntityUID(uid))
                if uid.entity_type().to_string() == "FleetRetire::Worker" =>
            {
                self.disabled = Some(format!("policy {} names a worker entity", policy.id()));
            }
            ExprKind::Like { pattern, expr } => {
                self.patterns.push((Glob::of(pattern), like_subject(expr)));
            }
            ExprKind::ExtensionFunctionApp { fn_name, .. } => {
                self.disabled = Some(format!("policy {} calls {fn_name}", policy.id()));
            }
            ExprKind::BinaryApp {
                op: BinaryOp::GetTag | BinaryOp::HasTag,
                ..
            } => {
                self.disabled = Some(format!("policy {} reads tags", policy.id()));
            }
            _ => {}
        }
    }

    /// The abstraction: Longs sorted and distinct, and each known string
    /// classed (a run-set element that is also a literal is kept verbatim;
    /// the others are placeholders of their class: the sets that hold them).
    fn into_abstraction(self) -> Abstraction {
        let mut longs = self.longs;
        longs.sort_unstable();
        longs.dedup();
        let mut known: HashMap<SmolStr, Known> = self
            .literals
            .iter()
            .map(|l| (l.clone(), Known::Literal))
            .collect();
        for (t, bits) in self.memberships {
            known.entry(t).or_insert(Known::Member(bits));
        }
        let literal_filter = LiteralFilter::of(known.keys());
        Abstraction {
            known: KnownTable::of(known),
            literal_filter,
            longs,
            patterns: self.patterns,
            disabled: self.disabled,
            reads: None,
            mask: std::sync::OnceLock::new(),
        }
    }
}

/// The worker attribute a `like` is applied to, when its subject is
/// `resource.A`; `None` when it is anything else.
fn like_subject(expr: &ast::Expr) -> Option<SmolStr> {
    match expr.expr_kind() {
        ExprKind::GetAttr { expr, attr }
            if matches!(expr.expr_kind(), ExprKind::Var(Var::Resource)) =>
        {
            Some(attr.clone())
        }
        _ => None,
    }
}

/// How `e` uses the resource: `(1, 0)` the resource itself, `(0, 1)`
/// through an attribute or its type (`has`, `.`, `is`), `(0, 0)` not at all.
/// A policy whose first count exceeds its second reads the resource some
/// other way.
fn resource_use(e: &ast::Expr) -> (usize, usize) {
    let on_resource = |expr: &ast::Expr| matches!(expr.expr_kind(), ExprKind::Var(Var::Resource));
    match e.expr_kind() {
        ExprKind::Var(Var::Resource) => (1, 0),
        ExprKind::GetAttr { expr, .. } | ExprKind::HasAttr { expr, .. } if on_resource(expr) => {
            (0, 1)
        }
        ExprKind::ExtHasAttr { expr, .. } if on_resource(expr) => (0, 1),
        ExprKind::Is { expr, .. } if on_resource(expr) => (0, 1),
        _ => (0, 0),
    }
}
impl Abstraction {
    /// Analyse the policy set. `run_strings` are the strings of the run
    /// entity (equal for every row, so kept verbatim).
    pub fn new(policies: &Policies, run_attrs: &[(&'static str, Attr<'_>)]) -> Abstraction {
        let set: &ast::PolicySet = policies.set.as_ref();
        let mut seen = Observables::of_run(run_attrs);
        // Every column name is kept verbatim wherever it occurs, so that a
        // set of column names (`Attr::Columns`) can be keyed by its bits:
        // the bits name its elements exactly, and any other string equal to
        // one of them is written as itself.
        seen.literals
            .extend(all_column_names().map(SmolStr::new_static));
        for policy in set.policies() {
            seen.scan(policy);
        }
        seen.into_abstraction()
    }

    /// The same abstraction for requests of these actions only: the key
    /// keeps just the worker attributes that a policy which can apply to
    /// one of them reads. A policy scoped to another action is false at its
    /// scope (Cedar's `&&` stops there) and reads nothing.
    pub fn for_actions(mut self, policies: &Policies, actions: &[&str]) -> Abstraction {
        use cedar_policy::ActionConstraint;
        let mut reads = HashSet::default();
        for policy in policies.set.policies() {
            let applies = match policy.action_constraint() {
                ActionConstraint::Any => true,
                ActionConstraint::Eq(a) => actions.contains(&a.id().unescaped()),
                ActionConstraint::In(list) => {
                    list.iter().any(|a| actions.contains(&a.id().unescaped()))
                }
            };
            if !applies {
                continue;
            }
            let ast: &ast::Policy = policy.as_ref();
            for e in ast.condition().subexpressions() {
                if let ExprKind::GetAttr { expr, attr } | ExprKind::HasAttr { expr, attr } =
                    e.expr_kind()
                {
                    if matches!(expr.expr_kind(), ExprKind::Var(Var::Resource)) {
                        reads.insert(attr.clone());
                    }
                }
            }
        }
        self.reads = Some(reads);
        self.mask = std::sync::OnceLock::new();
        self
    }

    /// The worker attributes a key (and an evaluation) needs built.
    pub fn attr_mask(&self) -> crate::policy::entities::AttrMask {
        crate::policy::entities::AttrMask::of(|n| self.read(n))
    }

    fn read(&self, name: &str) -> bool {
        self.reads.as_ref().is_none_or(|r| r.contains(name))
    }

    /// An abstraction that shares nothing: every row is evaluated alone.
    pub fn off(why: &str) -> Abstraction {
        Abstraction {
            known: KnownTable::of(HashMap::default()),
            literal_filter: LiteralFilter::of(std::iter::empty()),
            longs: Vec::new(),
            patterns: Vec::new(),
            disabled: Some(why.to_string()),
            reads: None,
            mask: std::sync::OnceLock::new(),
        }
    }

    /// The Long literals of the policies and the run's Longs, sorted and
    /// distinct: the places a key gives each Long.
    pub fn longs(&self) -> &[i64] {
        &self.longs
    }

    /// Why memoisation is off, if it is.
    pub fn disabled(&self) -> Option<&str> {
        self.disabled.as_deref()
    }

    /// Write the situation key of a worker's attributes into `out`;
    /// `false` (and nothing written) when the memo is off.
    pub fn key(&self, attrs: &[(&'static str, Attr<'_>)], out: &mut String) -> bool {
        out.clear();
        if self.disabled.is_some() {
            return false;
        }
        let mut placeholders: Vec<&str> = Vec::with_capacity(attrs.len() + 8);
        let mask = self
            .mask
            .get_or_init(|| attrs.iter().map(|(n, _)| (*n, self.read(n))).collect());
        let same_shape = mask.len() == attrs.len()
            && mask
                .iter()
                .zip(attrs)
                .all(|((m, _), (n, _))| std::ptr::eq(*m, *n) || m == n);
        let keep = |i: usize, name: &str| {
            if same_shape {
                mask[i].1
            } else {
                self.read(name)
            }
        };
        // The row's Longs (a handful), each with its place among the
        // literals (`binary_search`'s answer), found once.
        let longs = RowLongs::of(attrs, &self.longs, &keep);
        let row_longs = longs.as_slice();
        let mut next_long = 0usize;
        out.push(if same_shape { '#' } else { '@' });
        for (name, value) in attrs
            .iter()
            .enumerate()
            .filter(|(i, (name, _))| keep(*i, name))
            .map(|(_, a)| a)
        {
            // A key of the usual shape names each attribute by its place;
            // any other spells the names out ('#' and '@' keep the two
            // kinds apart).
            if !same_shape {
                out.push_str(name);
                out.push('=');
            }
            match value {
                Attr::Bool(b) => out.push(if *b { 'T' } else { 'F' }),
                Attr::Long(n) => {
                    // The kept Longs come in the order they were listed.
                    push_long(out, *n, row_longs[next_long].1, row_longs);
                    next_long += 1;
                }
                Attr::Str(t) => self.encode(name, t, &mut placeholders, out),
                Attr::Set(items) => {
                    out.push('[');
                    for t in items {
                        self.encode(name, t, &mut placeholders, out);
                        out.push(',');
                    }
                    out.push(']');
                }
                Attr::Columns(bits) => {
                    // Its elements are literals (see `new`), which a key
                    // writes as themselves (no placeholder, no `like`
                    // bits: the text decides those): the bits say exactly
                    // the same.
                    out.push('C');
                    out.push_str(itoa::Buffer::new().format(*bits));
                }
            }
            out.push(';');
        }
        true
    }

    fn encode<'v>(
        &self,
        attribute: &str,
        s: &'v str,
        placeholders: &mut Vec<&'v str>,
        out: &mut String,
    ) {
        let known = if self.literal_filter.may_hold(s) {
            self.known.get(s)
        } else {
            None
        };
        match known {
            Some(Known::Literal) => {
                out.push('S');
                push_num(out, s.len());
                out.push(':');
                out.push_str(s);
                return;
            }
            Some(Known::Member(class)) => {
                out.push('Q');
                out.push_str(itoa::Buffer::new().format(class));
                out.push('.');
            }
            None => out.push('P'),
        }
        let first = match placeholders
            .iter()
            .position(|p| same_bytes(p.as_bytes(), s.as_bytes()))
        {
            Some(k) => {
                push_num(out, k);
                false
            }
            None => {
                placeholders.push(s);
                push_num(out, placeholders.len() - 1);
                true
            }
        };
        // A pattern aimed at this attribute is written at every occurrence
        // here; one aimed at no particular attribute, at the string's first
        // occurrence (the bit is a function of the string).
        out.push('/');
        for (p, subject) in &self.patterns {
            let applies = match subject {
                Some(a) => a.as_str() == attribute,
                None => first,
            };
            if applies {
                out.push(if p.matches(s) { '1' } else { '0' });
            }
        }
    }
}

/// The strings a key knows before it reads a row, for lookup: open
/// addressing with linear probing over at least twice as many slots as
/// strings, each slot holding the string's full hash, so a probe compares
/// text only when the hashes agree, and then without a call to `memcmp`
/// ([`same_bytes`]). A row's strings that pass the [`LiteralFilter`] are
/// mostly literals (a status, a probe's answer, this host's ids), so
/// nearly every lookup ends in such a comparison.
#[derive(Clone)]
struct KnownTable {
    slots: Vec<Option<(u64, Box<str>, Known)>>,
    mask: usize,
}

impl KnownTable {
    fn of(known: HashMap<SmolStr, Known>) -> KnownTable {
        let len = (known.len() * 2).next_power_of_two().max(8);
        let mut table = KnownTable {
            slots: vec![None; len],
            mask: len - 1,
        };
        for (text, what) in known {
            let hash = Self::hash(&text);
            let mut at = hash as usize & table.mask;
            while table.slots[at].is_some() {
                at = (at + 1) & table.mask;
            }
            table.slots[at] = Some((hash, Box::from(text.as_str()), what));
        }
        table
    }

    fn hash(s: &str) -> u64 {
        use std::hash::BuildHasher;
        rustc_hash::FxBuildHasher.hash_one(s)
    }

    /// What is known of `s`, if anything.
    #[inline]
    fn get(&self, s: &str) -> Option<Known> {
        let hash = Self::hash(s);
        let mut at = hash as usize & self.mask;
        // The table is never full (twice the strings), so an empty slot
        // ends every probe.
        loop {
            match &self.slots[at] {
                None => return None,
                Some((h, text, what))
                    if *h == hash && same_bytes(text.as_bytes(), s.as_bytes()) =>
                {
                    return Some(*what)
                }
                Some(_) => at = (at + 1) & self.mask,
            }
        }
    }
}

/// For each length (the last entry: that length or longer), the first and
/// last bytes of the literals of that length, as 256-bit sets. A string
/// whose length, first or last byte no literal has is not a literal: that
/// skips the hash lookup for nearly every string of a row (the run's own
/// ids give the literals many lengths, but rarely the same ends).
#[derive(Clone)]
struct LiteralFilter {
    ends: Vec<[[u64; 4]; 2]>,
}

impl LiteralFilter {
    const LENGTHS: usize = 128;

    fn of<'l>(literals: impl Iterator<Item = &'l SmolStr>) -> LiteralFilter {
        let mut ends = vec![[[0u64; 4]; 2]; Self::LENGTHS];
        for l in literals {
            let b = l.as_bytes();
            let e = &mut ends[b.len().min(Self::LENGTHS - 1)];
            // The empty literal marks byte 0 of its (otherwise unused) entry.
            let (first, last) = (
                b.first().copied().unwrap_or(0),
                b.last().copied().unwrap_or(0),
            );
            e[0][usize::from(first >> 6)] |= 1 << (first & 63);
            e[1][usize::from(last >> 6)] |= 1 << (last & 63);
        }
        LiteralFilter { ends }
    }

    /// False only when `s` is certainly not a literal.
    fn may_hold(&self, s: &str) -> bool {
        let b = s.as_bytes();
        let e = &self.ends[b.len().min(Self::LENGTHS - 1)];
        let (first, last) = (
            b.first().copied().unwrap_or(0),
            b.last().copied().unwrap_or(0),
        );
        e[0][usize::from(first >> 6)] & (1 << (first & 63)) != 0
            && e[1][usize::from(last >> 6)] & (1 << (last & 63)) != 0
    }
}

/// A Cedar `like` pattern as its literal pieces between wildcards, matched
/// without allocating (Cedar's own matcher copies the text into a vector of
/// chars; the key tests one string per row). A test holds it to Cedar's.
#[derive(Clone, Debug)]
struct Glob {
    /// The text between wildcards, in order; `pieces.len()` is one more
    /// than the number of wildcards (consecutive wildcards give empty
    /// pieces, which match anywhere).
    pieces: Vec<String>,
}

impl Glob {
    fn of(pattern: &Pattern) -> Glob {
        let mut pieces = vec![String::new()];
        for e in pattern.iter() {
            match e {
                PatternElem::Char(c) => pieces.last_mut().expect("never empty").push(*c),
                PatternElem::Wildcard => pieces.push(String::new()),
            }
        }
        Glob { pieces }
    }

    /// Whether `text` matches: the first piece is a prefix, the last a
    /// suffix after it, and the middle pieces occur in order between them
    /// (taking each at its leftmost place leaves the most room for the
    /// rest). UTF-8 is self-synchronising, so byte-wise substring search
    /// finds exactly the char-wise matches.
    fn matches(&self, text: &str) -> bool {
        let (first, rest) = self.pieces.split_first().expect("never empty");
        let Some((last, middle)) = rest.split_last() else {
            return text == first;
        };
        // An empty end (a pattern that starts or ends with `*`, as most
        // do) matches anything: no comparison is made for it.
        let bytes = text.as_bytes();
        if bytes.len() < first.len() + last.len()
            || (!first.is_empty() && !same_bytes(&bytes[..first.len()], first.as_bytes()))
            || (!last.is_empty()
                && !same_bytes(&bytes[bytes.len() - last.len()..], last.as_bytes()))
        {
            return false;
        }
        let mut between = &text[first.len()..text.len() - last.len()];
        for piece in middle {
            match between.find(piece.as_str()) {
                Some(at) => between = &between[at + piece.len()..],
                None => return false,
            }
        }
        true
    }
}

/// A row's kept Longs with their places among the literals, on the stack
/// unless there are more than 16.
struct RowLongs {
    buf: [(i64, Result<usize, usize>); 16],
    more: Vec<(i64, Result<usize, usize>)>,
    len: usize,
}

impl RowLongs {
    #[inline]
    fn of(
        attrs: &[(&'static str, Attr<'_>)],
        literals: &[i64],
        keep: &impl Fn(usize, &str) -> bool,
    ) -> RowLongs {
        let mut longs = RowLongs {
            buf: [(0i64, Ok(0)); 16],
            more: Vec::new(),
            len: 0,
        };
        for (i, (name, v)) in attrs.iter().enumerate() {
            if let Attr::Long(n) = v {
                if keep(i, name) {
                    longs.push((*n, literals.binary_search(n)));
                }
            }
        }
        longs
    }

    #[inline]
    fn push(&mut self, long: (i64, Result<usize, usize>)) {
        if self.len < self.buf.len() {
            self.buf[self.len] = long;
        } else {
            if self.more.is_empty() {
                self.more.extend_from_slice(&self.buf);
            }
            self.more.push(long);
        }
        self.len += 1;
    }

    #[inline]
    fn as_slice(&self) -> &[(i64, Result<usize, usize>)] {
        if self.len <= self.buf.len() {
            &self.buf[..self.len]
        } else {
            &self.more
        }
    }
}

/// Write one Long of a key: its literal (`E` and its index), or the gap
/// between two literals (`B`) and its rank among the row's Longs in that
/// gap, which is all a comparison with the literals can tell apart.
#[inline]
fn push_long(
    out: &mut String,
    n: i64,
    place: Result<usize, usize>,
    row_longs: &[(i64, Result<usize, usize>)],
) {
    match place {
        Ok(i) => {
            out.push('E');
            push_num(out, i);
        }
        Err(i) => {
            let rank = row_longs
                .iter()
                .filter(|(m, at)| *m < n && *at == Err(i))
                .count();
            out.push('B');
            push_num(out, i);
            out.push('r');
            push_num(out, rank);
        }
    }
}

/// Decimal digits of `n` (a key is built for every row; most numbers here
/// are single digits).
fn push_num(out: &mut String, n: usize) {
    if n < 10 {
        out.push(char::from(b'0' + n as u8));
    } else {
        out.push_str(itoa::Buffer::new().format(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter never rules a literal out, whatever its length or ends,
    /// and rules out strings whose ends no literal of their length has.
    #[test]
    fn the_literal_filter_keeps_every_literal() {
        let long = "x".repeat(300);
        let literals: HashSet<SmolStr> = [
            "",
            "a",
            "active",
            "controller",
            "trusted_launcher",
            "é",
            "zé",
            long.as_str(),
            "ab\u{0}",
            "\u{ff}\u{1}",
        ]
        .into_iter()
        .map(SmolStr::from)
        .collect();
        let filter = LiteralFilter::of(literals.iter());
        for l in &literals {
            assert!(filter.may_hold(l), "{l:?}");
        }
        for (s, expected) in [
            ("b", false),
            ("activf", false),
            ("bctive", false),
            ("acxxve", true),
            ("y".repeat(300).as_str(), false),
            (format!("{long}y").as_str(), false),
            (format!("x{long}").as_str(), true),
            ("", true),
        ] {
            assert_eq!(filter.may_hold(s), expected, "{s:?}");
            if !filter.may_hold(s) {
                assert!(!literals.contains(s));
            }
        }
        assert!(!LiteralFilter::of(std::iter::empty()).may_hold(""));
    }

    /// The key's table of known strings answers as the map it was made
    /// from, for each of its strings and for strings it does not hold
    /// (among them ones that share a string's prefix, suffix or length).
    #[test]
    fn the_known_table_answers_as_its_map() {
        let mut map: HashMap<SmolStr, Known> = HashMap::default();
        for i in 0..500u64 {
            let text = match i % 4 {
                0 => format!("lit-{i}"),
                1 => format!("sess-{i:012}"),
                2 => "x".repeat(i as usize % 40),
                _ => format!("{i}"),
            };
            let what = if i % 3 == 0 {
                Known::Literal
            } else {
                Known::Member(i)
            };
            map.entry(SmolStr::from(text)).or_insert(what);
        }
        let table = KnownTable::of(map.clone());
        for (text, what) in &map {
            assert_eq!(table.get(text), Some(*what), "{text:?}");
        }
        for i in 0..2000u64 {
            for text in [
                format!("lit-{i}x"),
                format!("xlit-{i}"),
                format!("sess-{i:011}"),
                "y".repeat(i as usize % 50),
                format!("{}", i + 1_000_000),
            ] {
                assert_eq!(
                    table.get(&text),
                    map.get(text.as_str()).copied(),
                    "{text:?}"
                );
            }
        }
        assert_eq!(KnownTable::of(HashMap::default()).get(""), None);
    }

    /// The key's matcher answers as Cedar's on every pattern and text over
    /// a small alphabet (wildcards, repeats, multi-byte chars, the empty
    /// string), all lengths up to four.
    #[test]
    fn glob_matches_exactly_what_cedar_matches() {
        let alphabet = ['a', 'b', 'é', '*'];
        let mut strings = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for s in &frontier {
                for c in alphabet {
                    let mut t = s.clone();
                    t.push(c);
                    next.push(t);
                }
            }
            strings.extend(next.iter().cloned());
            frontier = next;
        }
        let mut checked = 0;
        for p in &strings {
            // In a pattern, '*' is the wildcard; in a text, a plain char.
            let elems: Vec<PatternElem> = p
                .chars()
                .map(|c| match c {
                    '*' => PatternElem::Wildcard,
                    c => PatternElem::Char(c),
                })
                .collect();
            let pattern = Pattern::from(elems);
            let glob = Glob::of(&pattern);
            for t in &strings {
                assert_eq!(
                    glob.matches(t),
                    pattern.wildcard_match(t),
                    "pattern {p:?} text {t:?}"
                );
                checked += 1;
            }
        }
        assert!(checked > 100_000);
    }
}
