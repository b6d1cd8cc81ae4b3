//! Version resolution with PubGrub.
//!
//! Plugins require *services* (with semver ranges), which other plugins provide. The solver
//! sees three kinds of packages: the root (what the user asked for, plus what is already
//! installed), plugins, and services. A plugin version depends on each required service's
//! range (optional requirements do not take part); a service version depends on the exact
//! plugin release that provides it. A service's versions are its provided versions, one per
//! providing release, so two plugins providing the same service version are alternatives.
//!
//! Yanked versions are candidates only when the lockfile pins them; pre-release versions only
//! when asked for exactly (`=1.2.0-beta.1`). Among candidates the locked version is preferred,
//! then the highest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::fmt;
use std::ops::Bound;

use pubgrub::{
    Dependencies, DependencyProvider, DerivationTree, External, PackageResolutionStatistics,
    PubGrubError, Ranges,
};
use semver::{Comparator, Op, Prerelease, Version, VersionReq};

use crate::RegistryError;
use crate::index::IndexLog;
use crate::name::PluginName;

/// One release as the resolver sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its version.
    pub version: Version,
    /// Non-optional service requirements.
    pub requires: Vec<(String, VersionReq)>,
    /// Services it provides.
    pub provides: BTreeMap<String, Version>,
    /// Whether it is yanked.
    pub yanked: bool,
}

/// Every release of every plugin in a registry.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    plugins: BTreeMap<PluginName, Vec<Candidate>>,
    services: BTreeMap<String, Vec<ServiceOffer>>,
}

#[derive(Debug, Clone)]
struct ServiceOffer {
    version: Version,
    provider: PluginName,
    provider_version: Version,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Catalog {
        Catalog::default()
    }

    /// Add a release.
    pub fn add(&mut self, name: PluginName, candidate: Candidate) {
        for (service, version) in &candidate.provides {
            self.services
                .entry(service.clone())
                .or_default()
                .push(ServiceOffer {
                    version: version.clone(),
                    provider: name.clone(),
                    provider_version: candidate.version.clone(),
                });
        }
        let list = self.plugins.entry(name).or_default();
        list.push(candidate);
    }

    /// Add every release of a checked index; a release whose requirement ranges do not parse
    /// is left out.
    pub fn add_log(&mut self, log: &IndexLog) {
        for v in log.versions() {
            let requires: Result<Vec<(String, VersionReq)>, _> = v
                .release
                .requires
                .iter()
                .filter(|(_, r)| !r.optional)
                .map(|(service, r)| {
                    VersionReq::parse(&r.range).map(|range| (service.clone(), range))
                })
                .collect();
            // A range that does not parse (it did at publish time) makes the release unusable.
            let Ok(requires) = requires else {
                continue;
            };
            self.add(
                log.name().clone(),
                Candidate {
                    version: v.record.version.clone(),
                    requires,
                    provides: v.release.provides.clone(),
                    yanked: v.yanked_by.is_some(),
                },
            );
        }
    }

    /// Sort everything; call once after the last `add`.
    pub fn finish(&mut self) {
        for list in self.plugins.values_mut() {
            list.sort_by(|a, b| a.version.cmp(&b.version));
        }
        for offers in self.services.values_mut() {
            offers.sort_by(|a, b| {
                (&a.version, &a.provider, &a.provider_version).cmp(&(
                    &b.version,
                    &b.provider,
                    &b.provider_version,
                ))
            });
        }
    }

    /// The releases of `name`, oldest first.
    pub fn releases(&self, name: &PluginName) -> &[Candidate] {
        self.plugins.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether the catalog knows `name`.
    pub fn contains(&self, name: &PluginName) -> bool {
        self.plugins.contains_key(name)
    }
}

/// What to resolve: requested plugins with ranges, and the plugins the lockfile holds.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Plugins asked for.
    pub wanted: Vec<(PluginName, VersionReq)>,
    /// Plugins already installed (from this registry), at their locked versions: they stay
    /// installed, preferably at that version, and may be chosen even when yanked.
    pub locked: BTreeMap<PluginName, Version>,
}

/// A package of the resolution problem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Pkg {
    Root,
    Plugin(PluginName),
    Service(String),
}

impl fmt::Display for Pkg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pkg::Root => f.write_str("your request"),
            Pkg::Plugin(n) => write!(f, "{n}"),
            Pkg::Service(s) => write!(f, "service `{s}`"),
        }
    }
}

/// A version in the solver: the semver version and, for services, which providing release.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Ver {
    v: Version,
    offer: u32,
}

impl fmt::Display for Ver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.v)
    }
}

fn ver(v: Version) -> Ver {
    Ver { v, offer: 0 }
}

fn ver_max(v: Version) -> Ver {
    Ver { v, offer: u32::MAX }
}

/// `major.minor.patch-0`: the lowest version with these numbers.
fn floor(major: u64, minor: u64, patch: u64) -> Ver {
    let mut v = Version::new(major, minor, patch);
    v.pre = Prerelease::new("0").unwrap_or(Prerelease::EMPTY);
    ver(v)
}

fn comparator_ranges(c: &Comparator) -> Ranges<Ver> {
    let (maj, min, pat) = (c.major, c.minor, c.patch);
    let full = |m: u64, p: u64| {
        let mut v = Version::new(maj, m, p);
        v.pre = c.pre.clone();
        v
    };
    let lower = Version::new(maj, min.unwrap_or(0), pat.unwrap_or(0));
    let between =
        |lo: Ver, hi: Ver| Ranges::from_range_bounds((Bound::Included(lo), Bound::Excluded(hi)));
    match c.op {
        Op::Exact | Op::Wildcard => match (min, pat) {
            (Some(m), Some(p)) => Ranges::from_range_bounds((
                Bound::Included(ver(full(m, p))),
                Bound::Included(ver_max(full(m, p))),
            )),
            (Some(m), None) => between(ver(lower), floor(maj, m + 1, 0)),
            _ => between(ver(lower), floor(maj + 1, 0, 0)),
        },
        Op::Greater => match (min, pat) {
            (Some(m), Some(p)) => Ranges::strictly_higher_than(ver_max(full(m, p))),
            (Some(m), None) => Ranges::higher_than(ver(Version::new(maj, m + 1, 0))),
            _ => Ranges::higher_than(ver(Version::new(maj + 1, 0, 0))),
        },
        Op::GreaterEq => match (min, pat) {
            (Some(m), Some(p)) => Ranges::higher_than(ver(full(m, p))),
            _ => Ranges::higher_than(ver(lower)),
        },
        Op::Less => match (min, pat) {
            (Some(m), Some(p)) if !c.pre.is_empty() => Ranges::strictly_lower_than(ver(full(m, p))),
            (Some(m), Some(p)) => Ranges::strictly_lower_than(floor(maj, m, p)),
            (Some(m), None) => Ranges::strictly_lower_than(floor(maj, m, 0)),
            _ => Ranges::strictly_lower_than(floor(maj, 0, 0)),
        },
        Op::LessEq => match (min, pat) {
            (Some(m), Some(p)) => Ranges::lower_than(ver_max(full(m, p))),
            (Some(m), None) => Ranges::strictly_lower_than(floor(maj, m + 1, 0)),
            _ => Ranges::strictly_lower_than(floor(maj + 1, 0, 0)),
        },
        Op::Tilde => match (min, pat) {
            (Some(m), Some(p)) => between(ver(full(m, p)), floor(maj, m + 1, 0)),
            (Some(m), None) => between(ver(lower), floor(maj, m + 1, 0)),
            _ => between(ver(lower), floor(maj + 1, 0, 0)),
        },
        Op::Caret => match (maj, min, pat) {
            (0, Some(0), Some(p)) => between(ver(full(0, p)), floor(0, 0, p + 1)),
            (0, Some(m), Some(p)) => between(ver(full(m, p)), floor(0, m + 1, 0)),
            (_, Some(m), Some(p)) => between(ver(full(m, p)), floor(maj + 1, 0, 0)),
            (0, Some(m), None) => between(ver(lower), floor(0, m + 1, 0)),
            (_, Some(_), None) | (_, None, _) => between(ver(lower), floor(maj + 1, 0, 0)),
        },
        _ => Ranges::empty(),
    }
}

/// The set of versions a semver range admits, ignoring the pre-release rule (applied when
/// choosing).
fn req_ranges(req: &VersionReq) -> Ranges<Ver> {
    req.comparators.iter().fold(Ranges::full(), |acc, c| {
        acc.intersection(&comparator_ranges(c))
    })
}

/// Human form of a version set: `>=1.0.0, <2.0.0`, `1.2.3`, `*`; alternatives joined by
/// `or`.
fn show(ranges: &Ranges<Ver>) -> String {
    let shown = |v: &Ver| {
        let mut v = v.v.clone();
        if v.pre.as_str() == "0" {
            v.pre = Prerelease::EMPTY;
        }
        v.to_string()
    };
    let parts: Vec<String> = ranges
        .iter()
        .map(|segment| match segment {
            (Bound::Unbounded, Bound::Unbounded) => "*".to_owned(),
            (Bound::Included(a), Bound::Included(b)) if a.v == b.v => shown(a),
            (lo, hi) => {
                let lo = match lo {
                    Bound::Included(a) => Some(format!(">={}", shown(a))),
                    Bound::Excluded(a) => Some(format!(">{}", shown(a))),
                    Bound::Unbounded => None,
                };
                let hi = match hi {
                    Bound::Included(b) => Some(format!("<={}", shown(b))),
                    Bound::Excluded(b) => Some(format!("<{}", shown(b))),
                    Bound::Unbounded => None,
                };
                lo.into_iter().chain(hi).collect::<Vec<_>>().join(", ")
            }
        })
        .collect();
    if parts.is_empty() {
        "(no version)".to_owned()
    } else {
        parts.join(" or ")
    }
}

struct Problem<'a> {
    catalog: &'a Catalog,
    request: &'a Request,
}

impl Problem<'_> {
    fn allowed(&self, name: &PluginName, c: &Candidate, range: &Ranges<Ver>) -> bool {
        if c.yanked && self.request.locked.get(name) != Some(&c.version) {
            return false;
        }
        if !c.version.pre.is_empty() {
            let pinned = range.iter().next().is_some_and(|s| {
                matches!(s, (Bound::Included(a), Bound::Included(b)) if a.v == c.version && b.v == c.version)
            });
            if !pinned {
                return false;
            }
        }
        range.contains(&ver(c.version.clone()))
    }

    fn offer_allowed(&self, offer: &ServiceOffer) -> bool {
        self.catalog
            .releases(&offer.provider)
            .iter()
            .find(|c| c.version == offer.provider_version)
            .is_some_and(|c| {
                (!c.yanked || self.request.locked.get(&offer.provider) == Some(&c.version))
                    && c.version.pre.is_empty()
                    && offer.version.pre.is_empty()
            })
    }
}

impl DependencyProvider for Problem<'_> {
    type P = Pkg;
    type V = Ver;
    type VS = Ranges<Ver>;
    type M = String;
    type Err = Infallible;
    type Priority = (u32, Reverse<usize>);

    fn prioritize(
        &self,
        package: &Pkg,
        range: &Ranges<Ver>,
        stats: &PackageResolutionStatistics,
    ) -> Self::Priority {
        let count = match package {
            Pkg::Root => 0,
            Pkg::Plugin(n) => self
                .catalog
                .releases(n)
                .iter()
                .filter(|c| range.contains(&ver(c.version.clone())))
                .count(),
            Pkg::Service(s) => self.catalog.services.get(s).map_or(0, Vec::len),
        };
        (stats.conflict_count(), Reverse(count))
    }

    fn choose_version(
        &self,
        package: &Pkg,
        range: &Ranges<Ver>,
    ) -> Result<Option<Ver>, Infallible> {
        Ok(match package {
            Pkg::Root => Some(ver(Version::new(0, 0, 0))),
            Pkg::Plugin(n) => {
                let releases = self.catalog.releases(n);
                let locked = self.request.locked.get(n);
                let preferred = locked.and_then(|l| {
                    releases
                        .iter()
                        .find(|c| &c.version == l && self.allowed(n, c, range))
                });
                preferred
                    .or_else(|| releases.iter().rev().find(|c| self.allowed(n, c, range)))
                    .map(|c| ver(c.version.clone()))
            }
            Pkg::Service(s) => {
                let offers = self
                    .catalog
                    .services
                    .get(s)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                let candidates = offers.iter().enumerate().filter(|(i, o)| {
                    self.offer_allowed(o)
                        && range.contains(&Ver {
                            v: o.version.clone(),
                            offer: *i as u32,
                        })
                });
                // Highest service version first; among its providers, one already installed
                // at that version, else the last (highest provider version).
                candidates
                    .max_by_key(|(i, o)| {
                        let locked =
                            self.request.locked.get(&o.provider) == Some(&o.provider_version);
                        (o.version.clone(), locked, *i)
                    })
                    .map(|(i, o)| Ver {
                        v: o.version.clone(),
                        offer: i as u32,
                    })
            }
        })
    }

    fn get_dependencies(
        &self,
        package: &Pkg,
        version: &Ver,
    ) -> Result<Dependencies<Pkg, Ranges<Ver>, String>, Infallible> {
        Ok(match package {
            Pkg::Root => {
                let mut deps: Vec<(Pkg, Ranges<Ver>)> = self
                    .request
                    .wanted
                    .iter()
                    .map(|(n, r)| (Pkg::Plugin(n.clone()), req_ranges(r)))
                    .collect();
                for name in self.request.locked.keys() {
                    if !self.request.wanted.iter().any(|(n, _)| n == name) {
                        deps.push((Pkg::Plugin(name.clone()), Ranges::full()));
                    }
                }
                Dependencies::Available(deps.into_iter().collect())
            }
            Pkg::Plugin(n) => match self
                .catalog
                .releases(n)
                .iter()
                .find(|c| c.version == version.v)
            {
                Some(c) => Dependencies::Available(
                    c.requires
                        .iter()
                        .map(|(s, r)| (Pkg::Service(s.clone()), req_ranges(r)))
                        .collect(),
                ),
                None => {
                    Dependencies::Unavailable(format!("{n} {} is not in the registry", version.v))
                }
            },
            Pkg::Service(s) => match self
                .catalog
                .services
                .get(s)
                .and_then(|o| o.get(version.offer as usize))
            {
                Some(offer) => Dependencies::Available(
                    [(
                        Pkg::Plugin(offer.provider.clone()),
                        Ranges::singleton(ver(offer.provider_version.clone())),
                    )]
                    .into_iter()
                    .collect(),
                ),
                None => Dependencies::Unavailable(format!("no provider of service `{s}`")),
            },
        })
    }
}

/// Resolve `request` against `catalog`: the plugin versions to install (requested ones, what
/// they need, and what stays installed).
pub fn resolve(
    catalog: &Catalog,
    request: &Request,
) -> Result<BTreeMap<PluginName, Version>, RegistryError> {
    let problem = Problem { catalog, request };
    match pubgrub::resolve(&problem, Pkg::Root, ver(Version::new(0, 0, 0))) {
        Ok(solution) => Ok(solution
            .into_iter()
            .filter_map(|(p, v)| match p {
                Pkg::Plugin(n) => Some((n, v.v)),
                _ => None,
            })
            .collect()),
        Err(PubGrubError::NoSolution(tree)) => Err(RegistryError::Unresolvable {
            explanation: explain(&problem, &tree),
        }),
        Err(e) => Err(RegistryError::Internal(e.to_string())),
    }
}

/// A cargo-style explanation: every fact that led to the conflict, naming who needs what,
/// then what to do.
fn explain(problem: &Problem<'_>, tree: &DerivationTree<Pkg, Ranges<Ver>, String>) -> String {
    let mut facts: Vec<String> = Vec::new();
    collect(problem, tree, &mut facts);
    let mut seen = BTreeSet::new();
    facts.retain(|f| seen.insert(f.clone()));
    // What the user asked for first, then the chain of requirements.
    facts.sort_by_key(|f| !f.starts_with("you asked for"));
    // Two requirements of one service: say why they cannot both hold.
    let mut required: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &facts {
        if let Some(service) = f
            .split_once("requires service `")
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(s, _)| s)
        {
            *required.entry(service).or_default() += 1;
        }
    }
    let notes: Vec<String> = required
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(s, _)| {
            format!("only one plugin can provide service `{s}`, at one version, at a time")
        })
        .collect();
    let mut lines: Vec<String> = facts
        .iter()
        .chain(&notes)
        .map(|f| format!("  - {f}"))
        .collect();
    lines.push(
        "so no set of versions satisfies all of these; ask for other versions (`keel info NAME` lists them), or publish a provider that matches"
            .to_owned(),
    );
    lines.join("\n")
}

fn collect(
    problem: &Problem<'_>,
    tree: &DerivationTree<Pkg, Ranges<Ver>, String>,
    out: &mut Vec<String>,
) {
    match tree {
        DerivationTree::Derived(d) => {
            collect(problem, &d.cause1, out);
            collect(problem, &d.cause2, out);
        }
        DerivationTree::External(e) => {
            if let Some(line) = describe(problem, e) {
                out.push(line);
            }
        }
    }
}

fn describe(problem: &Problem<'_>, e: &External<Pkg, Ranges<Ver>, String>) -> Option<String> {
    let service_offers = |s: &str| -> String {
        let offers: Vec<String> = problem
            .catalog
            .services
            .get(s)
            .map(|o| {
                o.iter()
                    .map(|o| format!("{} by {} {}", o.version, o.provider, o.provider_version))
                    .collect()
            })
            .unwrap_or_default();
        if offers.is_empty() {
            "no plugin in this registry provides it".to_owned()
        } else {
            format!("available: {}", offers.join(", "))
        }
    };
    Some(match e {
        External::NotRoot(..) => return None,
        External::FromDependencyOf(p1, vs1, p2, vs2) => match (p1, p2) {
            (Pkg::Root, Pkg::Plugin(n)) => {
                match problem.request.wanted.iter().find(|(w, _)| w == n) {
                    Some((_, req)) => format!("you asked for {n} {req}"),
                    None => format!(
                        "{n} is installed (at {}) and stays installed",
                        problem
                            .request
                            .locked
                            .get(n)
                            .map(ToString::to_string)
                            .unwrap_or_default()
                    ),
                }
            }
            (Pkg::Plugin(n), Pkg::Service(s)) => {
                // The range as the publisher wrote it, when every version meant agrees.
                let written: BTreeSet<String> = problem
                    .catalog
                    .releases(n)
                    .iter()
                    .filter(|c| vs1.contains(&ver(c.version.clone())))
                    .filter_map(|c| c.requires.iter().find(|(x, _)| x == s))
                    .map(|(_, r)| r.to_string())
                    .collect();
                let range = match written.len() {
                    1 => written.into_iter().collect(),
                    _ => show(vs2),
                };
                format!("{n} {} requires service `{s}` {range}", show(vs1))
            }
            (Pkg::Service(s), Pkg::Plugin(n)) => {
                format!(
                    "service `{s}` {} is provided by {n} {}",
                    show(vs1),
                    show(vs2)
                )
            }
            _ => format!("{p1} {} depends on {p2} {}", show(vs1), show(vs2)),
        },
        External::NoVersions(Pkg::Plugin(n), vs) => {
            let releases = problem.catalog.releases(n);
            if releases.is_empty() {
                format!("the registry has no plugin {n}")
            } else {
                let list: Vec<String> = releases
                    .iter()
                    .map(|c| {
                        if c.yanked {
                            format!("{} (yanked)", c.version)
                        } else {
                            c.version.to_string()
                        }
                    })
                    .collect();
                if releases
                    .iter()
                    .any(|c| vs.contains(&ver(c.version.clone())))
                {
                    format!(
                        "no usable version of {n} matches {} (published: {})",
                        show(vs),
                        list.join(", ")
                    )
                } else {
                    format!("{n} has no other version (published: {})", list.join(", "))
                }
            }
        }
        External::NoVersions(Pkg::Service(s), vs) => {
            format!(
                "no plugin provides service `{s}` {} ({})",
                show(vs),
                service_offers(s)
            )
        }
        External::NoVersions(p, vs) => format!("no version of {p} matches {}", show(vs)),
        External::Custom(p, vs, m) => format!("{p} {}: {m}", show(vs)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_agree_with_semver() -> Result<(), semver::Error> {
        let reqs = [
            "^1.2.3",
            "^0.2.3",
            "^0.0.3",
            "^1.2",
            "^0.2",
            "^0.0",
            "^1",
            "^0",
            "~1.2.3",
            "~1.2",
            "~1",
            "=1.2.3",
            "=1.2",
            "=1",
            "1.*",
            "1.2.*",
            "*",
            ">1.2.3",
            ">1.2",
            ">1",
            ">=1.2.3",
            ">=1.2",
            "<1.2.3",
            "<1.2",
            "<1",
            "<=1.2.3",
            "<=1.2",
            "<=1",
            ">=1.2, <1.5",
            ">=0.1.0, <0.3.0",
        ];
        let mut versions = Vec::new();
        for major in 0..3 {
            for minor in 0..4 {
                for patch in 0..5 {
                    versions.push(Version::new(major, minor, patch));
                }
            }
        }
        for r in reqs {
            let req = VersionReq::parse(r)?;
            let ranges = req_ranges(&req);
            for v in &versions {
                assert_eq!(
                    req.matches(v),
                    ranges.contains(&ver(v.clone())),
                    "{r} vs {v}: ranges {}",
                    show(&ranges)
                );
                // Every providing release of the same service version too.
                assert_eq!(
                    req.matches(v),
                    ranges.contains(&Ver {
                        v: v.clone(),
                        offer: 7
                    }),
                    "{r} vs {v} (offer 7)"
                );
            }
        }
        Ok(())
    }
}
