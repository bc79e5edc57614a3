//! The roles docs/multi-host.md tells an operator to create, made from the
//! SQL blocks of that page itself ("The roles, and exactly their grants"):
//! the PostgreSQL tests connect as them, so a grant the page does not list
//! fails a test, and a mechanism of ours that needs more is found.

use super::PgDb;

/// The page the blocks are read from.
const PAGE: &str = include_str!("../../docs/multi-host.md");

/// The body of the fenced block whose info string is `sql NAME`.
pub fn block(name: &str) -> String {
    let fence = format!("```sql {name}\n");
    let start = PAGE
        .find(&fence)
        .unwrap_or_else(|| panic!("docs/multi-host.md has no ```sql {name} block"))
        + fence.len();
    let len = PAGE[start..].find("```").expect("the block ends");
    PAGE[start..start + len].to_string()
}

/// URLs of `db` as each documented role.
pub struct Roles {
    /// `fleet_owner`: makes the tables, installs the change record.
    pub owner: String,
    /// `fleet_apply`: plan, apply, apply-status, snapshot, serve.
    pub apply: String,
    /// `fleet_workers`: the workers' own rows.
    pub workers: String,
}

/// `url` (the superuser's) as `role`.
pub fn url_as(url: &str, role: &str) -> String {
    let (scheme_user, rest) = url.split_once('@').unwrap();
    let scheme = scheme_user.split_once("://").unwrap().0;
    format!("{scheme}://{role}@{rest}")
}

/// The cluster's and the database's part of the documented setup
/// (`roles-cluster`, `roles-database`), run as the superuser at `admin`
/// (a URL of the fleet's database); the owner's grants come after the
/// tables ([`grant_documented`]).
pub fn documented_roles_at(admin: &str) -> Roles {
    let mut admin_client = super::patroni::connect(admin);
    for statement in block("roles-cluster").lines().filter(|l| !l.is_empty()) {
        // Once per cluster: a role another test made already is fine; two
        // tests making one at once may see either error.
        if let Err(e) = admin_client.batch_execute(statement) {
            let text = format!("{e:?}");
            assert!(
                text.contains("already exists")
                    || text.contains("duplicate key")
                    || text.contains("concurrently"),
                "{statement}: {e:?}"
            );
        }
    }
    admin_client
        .batch_execute(&block("roles-database"))
        .unwrap();
    Roles {
        owner: url_as(admin, "fleet_owner"),
        apply: url_as(admin, "fleet_apply"),
        workers: url_as(admin, "fleet_workers"),
    }
}

/// The owner's grants (`roles-grants`), run as the owner once its tables
/// exist.
pub fn grant_documented(roles: &Roles) {
    super::patroni::connect(&roles.owner)
        .batch_execute(&block("roles-grants"))
        .unwrap();
}

/// `sqlite` registry and leases copied (`registry copy`) into the database
/// at `admin` by the documented owner, the owner's grants made, and the
/// roles' URLs.
pub fn copied_as_documented(stores: &super::Stores, admin: &str) -> Roles {
    let roles = documented_roles_at(admin);
    fleet_retire::copy::copy(&stores.registry, Some(&stores.leases), &roles.owner).unwrap();
    grant_documented(&roles);
    roles
}

impl PgDb {
    /// This database's URL as `role`.
    pub fn url_as(&self, role: &str) -> String {
        url_as(&self.url, role)
    }

    /// [`documented_roles_at`] this database.
    pub fn documented_roles(&self) -> Roles {
        documented_roles_at(&self.url)
    }

    /// [`grant_documented`].
    pub fn grant_documented(&self, roles: &Roles) {
        grant_documented(roles)
    }
}
