//! Field paths as Kubernetes prints them: `spec.domain.devices.disks[3].name`.

use std::fmt;

/// A field path built from a root with `child` and `index` steps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// A path starting at `root` (`"spec"`, `"metadata"`; may be empty).
    #[must_use]
    pub fn new(root: &str) -> Self {
        Self(root.to_owned())
    }

    /// The path of a field below this one.
    #[must_use]
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Self(name.to_owned())
        } else {
            Self(format!("{}.{name}", self.0))
        }
    }

    /// The path of nested fields below this one: `children(&["domain", "cpu"])`.
    #[must_use]
    pub fn children(&self, names: &[&str]) -> Self {
        names.iter().fold(self.clone(), |p, n| p.child(n))
    }

    /// The path of a list element.
    #[must_use]
    pub fn index(&self, i: usize) -> Self {
        Self(format!("{}[{i}]", self.0))
    }

    /// The path of a map entry.
    #[must_use]
    pub fn key(&self, k: &str) -> Self {
        Self(format!("{}[{k}]", self.0))
    }

    /// The printed path.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<FieldPath> for String {
    fn from(p: FieldPath) -> Self {
        p.0
    }
}

impl From<&FieldPath> for String {
    fn from(p: &FieldPath) -> Self {
        p.0.clone()
    }
}

impl From<&str> for FieldPath {
    fn from(root: &str) -> Self {
        Self::new(root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_print_like_kubernetes_field_paths() {
        let p = FieldPath::new("spec")
            .children(&["domain", "devices", "disks"])
            .index(3);
        assert_eq!(
            p.child("name").to_string(),
            "spec.domain.devices.disks[3].name"
        );
        assert_eq!(FieldPath::new("").child("a").to_string(), "a");
        assert_eq!(
            FieldPath::new("metadata")
                .child("annotations")
                .key("x")
                .as_str(),
            "metadata.annotations[x]"
        );
    }
}
