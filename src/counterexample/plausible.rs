//! Making the attributes a difference needs hold ordinary values: a text
//! one of the attribute's usual values, a Long as close to the realistic
//! row's as the difference allows (then a round number), a set with the
//! realistic row's elements and no made-up ones. Each change is kept only
//! when the difference still shows.

use super::base::{alternatives, implied, realistic};
use super::{Search, Taken};
use serde_json::Value as Json;

impl Search<'_> {
    /// Every taken attribute made as ordinary as the difference allows:
    /// texts first (renaming a text renames it where a set holds it too),
    /// then Longs, then sets.
    pub(super) fn plausible(&self, mut taken: Vec<Taken>) -> Vec<Taken> {
        let rank = |v: &Json| match v {
            Json::String(_) => 0,
            Json::Number(_) => 1,
            _ => 2,
        };
        let mut order: Vec<usize> = (0..taken.len()).collect();
        order.sort_by_key(|&i| rank(&taken[i].value));
        for i in order {
            match taken[i].value.clone() {
                Json::String(s) => self.plausible_text(&mut taken, i, &s),
                Json::Number(n) => {
                    if let Some(n) = n.as_i64() {
                        self.plausible_long(&mut taken, i, n);
                    }
                }
                Json::Array(_) => self.plausible_set(&mut taken, i),
                _ => {}
            }
        }
        taken
    }

    /// The realistic value first, then the attribute's usual ones.
    fn options(&self, t: &Taken) -> Vec<Json> {
        let mut out: Vec<Json> = self.realistic(t.entity, &t.attr).into_iter().collect();
        for v in alternatives(self.type_of(t.entity), &t.attr) {
            if !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }

    /// A made-up text becomes a usual one: renamed in this attribute and
    /// wherever a taken set holds it (a lease naming the worker's pid
    /// keeps naming it), or else in this attribute alone.
    fn plausible_text(&self, taken: &mut Vec<Taken>, i: usize, text: &str) {
        let options = self.options(&taken[i]);
        // Most ordinary first: none after the model's own value is tried.
        for option in options.iter().filter(|o| o.is_string()) {
            if option == text {
                return;
            }
            let renamed = |t: &mut Vec<Taken>| {
                t[i].value = option.clone();
                for other in t.iter_mut() {
                    if let Json::Array(items) = &mut other.value {
                        for item in items.iter_mut().filter(|x| x.as_str() == Some(text)) {
                            *item = option.clone();
                        }
                    }
                }
            };
            if self.attempt(taken, renamed) {
                return;
            }
            if self.attempt(taken, |t| t[i].value = option.clone()) {
                return;
            }
        }
    }

    /// A Long becomes a usual value when one keeps the difference, else
    /// the value nearest the realistic one that does (a binary search
    /// from the model's value towards it), then a round number on the
    /// model's side of that.
    fn plausible_long(&self, taken: &mut Vec<Taken>, i: usize, value: i64) {
        let options = self.options(&taken[i]);
        // Longs the model made equal may have to stay equal (an age at
        // exactly its TTL): each value is tried on all of them, then on
        // this one alone.
        let set = |n: i64, taken: &mut Vec<Taken>| {
            let together = |t: &mut Vec<Taken>| {
                for other in t.iter_mut().filter(|o| o.value.as_i64() == Some(value)) {
                    other.value = Json::from(n);
                }
            };
            self.attempt(taken, together) || self.attempt(taken, |t| t[i].value = Json::from(n))
        };
        // Most ordinary first: none after the model's own value is tried.
        for option in options.iter().filter_map(Json::as_i64) {
            if option == value || set(option, taken) {
                return;
            }
        }
        let Some(toward) = self.realistic(taken[i].entity, &taken[i].attr) else {
            return;
        };
        let Some(toward) = toward.as_i64() else {
            return;
        };
        let (mut kept, mut lost) = (i128::from(value), i128::from(toward));
        let at = |n: i128, taken: &mut Vec<Taken>| set(i64::try_from(n).unwrap_or(value), taken);
        // Each value that keeps the difference is kept as it is tried.
        while (lost - kept).abs() > 1 {
            let middle = kept + (lost - kept) / 2;
            if at(middle, taken) {
                kept = middle;
            } else {
                lost = middle;
            }
        }
        for digits in (1..=12).rev() {
            let step = 10_i128.pow(digits);
            let round = if i128::from(value) >= kept {
                (kept + step - 1).div_euclid(step) * step
            } else {
                kept.div_euclid(step) * step
            };
            let between = round.min(kept) >= i128::from(value).min(kept)
                && round.max(kept) <= i128::from(value).max(kept);
            if round != kept && between && at(round, taken) {
                return;
            }
        }
    }

    /// A set holds the realistic row's elements when it can, no element
    /// the difference does not need, and usual values for made-up ones.
    fn plausible_set(&self, taken: &mut Vec<Taken>, i: usize) {
        let usual: Vec<Json> = self
            .realistic(taken[i].entity, &taken[i].attr)
            .and_then(|r| r.as_array().cloned())
            .unwrap_or_default();
        if !usual.is_empty() {
            self.attempt(taken, |t| {
                let mut merged = usual.clone();
                let own = t[i].value.as_array().cloned().unwrap_or_default();
                merged.extend(own.into_iter().filter(|x| !usual.contains(x)));
                t[i].value = Json::Array(merged);
            });
        }
        let items = taken[i].value.as_array().cloned().unwrap_or_default();
        for item in items.iter().filter(|x| !usual.contains(x)) {
            self.attempt(taken, |t| {
                if let Json::Array(list) = &mut t[i].value {
                    list.retain(|x| x != item);
                }
            });
        }
        let alternatives = alternatives(self.type_of(taken[i].entity), &taken[i].attr);
        let items = taken[i].value.as_array().cloned().unwrap_or_default();
        for item in items
            .iter()
            .filter(|x| !usual.contains(x) && !alternatives.contains(x))
        {
            for option in alternatives.iter().filter(|o| !items.contains(o)) {
                let replaced = self.attempt(taken, |t| {
                    if let Json::Array(list) = &mut t[i].value {
                        for x in list.iter_mut().filter(|x| *x == item) {
                            *x = option.clone();
                        }
                    }
                });
                if replaced {
                    break;
                }
            }
        }
    }

    /// The other attributes made to agree with the deciding ones
    /// ([`implied`]), each where the difference still shows.
    pub(super) fn consistent(&self, mut taken: Vec<Taken>) -> Vec<Taken> {
        for i in 0..self.model.len() {
            let type_name = self.type_of(i).to_string();
            let attrs = self.compose(&taken)[i]["attrs"].clone();
            for (attr, value) in implied(&type_name, &attrs) {
                let deciding = taken.iter().any(|t| t.entity == i && t.attr == attr);
                if deciding || attrs[attr] == value || attrs.get(attr).is_none() {
                    continue;
                }
                self.attempt(&mut taken, |t| {
                    t.push(Taken {
                        entity: i,
                        attr: attr.to_string(),
                        value,
                        implied: true,
                    });
                });
            }
        }
        taken
    }

    /// Entities other than the request's principal and resource are left
    /// out when the difference shows without them.
    pub(super) fn drop_other_entities(&mut self, taken: &[Taken]) {
        if self.model.len() <= 2 {
            return;
        }
        let mut entities = self.compose(taken);
        entities.truncate(2);
        if self.holds(&self.request, entities) {
            self.model.truncate(2);
        }
    }

    /// The principal and resource named as a plan names them (`current`,
    /// `row-0`; `controller-prgs`, `registry`), when the difference still
    /// shows (no policy reads an entity's id, but one could).
    pub(super) fn rename_ids(&mut self, taken: &[Taken]) {
        for (i, role) in [(0, "principal"), (1, "resource")] {
            let Some((id, _)) = self
                .model
                .get(i)
                .and_then(|e| e["uid"]["type"].as_str())
                .and_then(realistic)
            else {
                continue;
            };
            let mut request = self.request.clone();
            request[role]["id"] = Json::from(id);
            let mut entities = self.compose(taken);
            entities[i]["uid"]["id"] = Json::from(id);
            if self.holds(&request, entities) {
                self.request = request;
                self.model[i]["uid"]["id"] = Json::from(id);
            }
        }
    }
}
