// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Serialisation of what the library reports (feature `serde`): transfers, the compat engine's
//! reports and settings, the module's info, errors. Enumerations serialise as the names the CLI
//! prints (`"p2p"`, `"no_module"`); a transfer and an engine carry their explanation (`why`),
//! an error its kind, message and errno. `gdirect --json` prints these.

use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};

use crate::{
    compat::PageCache, CompatReason, Engine, Error, ErrorKind, Info, IoPath, MapType, Provider,
    Reason, Transfer, Transport, Version,
};

/// Serialises each type as its `name()`.
macro_rules! by_name {
    ($($t:ty)*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    )*};
}
by_name!(IoPath Reason Transport Provider MapType ErrorKind CompatReason PageCache);

/// `{"name": "compat", "reason": "no_module", "why": "..."}`; `reason` is null for the module.
impl Serialize for Engine {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Engine", 3)?;
        st.serialize_field("name", self.name())?;
        let reason = match self {
            Engine::Module => None,
            Engine::Compat(why) => Some(*why),
        };
        st.serialize_field("reason", &reason)?;
        st.serialize_field("why", &self.explain())?;
        st.end()
    }
}

/// Its fields, and `why`: the reason explained for its transport.
impl Serialize for Transfer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Transfer", 8)?;
        st.serialize_field("engine", &self.engine)?;
        st.serialize_field("bytes", &self.bytes)?;
        st.serialize_field("path", &self.path)?;
        st.serialize_field("reason", &self.reason)?;
        st.serialize_field("transport", &self.transport)?;
        st.serialize_field("why", &self.reason.explain(self.transport))?;
        st.serialize_field("eof", &self.eof)?;
        st.serialize_field("bounce_bytes", &self.bounce_bytes)?;
        st.end()
    }
}

/// `"1.2.3"`.
impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `{"kind": "open_file", "message": "...", "errno": "ENOENT"}` (`errno` null where there is
/// none).
impl Serialize for Error {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Error", 3)?;
        st.serialize_field("kind", &self.kind())?;
        st.serialize_field("message", &self.to_string())?;
        st.serialize_field("errno", &self.errno().map(|e| format!("{e:?}")))?;
        st.end()
    }
}

/// Its fields, with `providers` as a map of every provider the ABI defines to whether the
/// module can use it now.
impl Serialize for Info {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Providers<'a>(&'a Info);
        impl Serialize for Providers<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(Provider::ALL.len()))?;
                for p in Provider::ALL {
                    m.serialize_entry(p.name(), &self.0.has_provider(p))?;
                }
                m.end()
            }
        }
        let mut st = s.serialize_struct("Info", 13)?;
        st.serialize_field("abi_version", &self.abi_version)?;
        st.serialize_field("version", &self.version)?;
        st.serialize_field("providers", &Providers(self))?;
        st.serialize_field("open_files", &self.open_files)?;
        st.serialize_field("file_registrations", &self.file_registrations)?;
        st.serialize_field("file_pinned_bytes", &self.file_pinned_bytes)?;
        st.serialize_field("registrations", &self.registrations)?;
        st.serialize_field("pinned_bytes", &self.pinned_bytes)?;
        st.serialize_field("revocations", &self.revocations)?;
        st.serialize_field("user_pinned_bytes", &self.user_pinned_bytes)?;
        st.serialize_field("max_pinned_bytes", &self.max_pinned_bytes)?;
        st.serialize_field("max_pinned_bytes_per_user", &self.max_pinned_bytes_per_user)?;
        st.serialize_field("max_registrations", &self.max_registrations)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compat::{Report, Settings};

    fn json(v: &impl Serialize) -> serde_json::Value {
        serde_json::to_value(v).expect("serialises")
    }

    #[test]
    fn reports_serialise_with_the_clis_names() {
        let t = Transfer {
            engine: Engine::Compat(CompatReason::NoModule),
            bytes: 4096,
            path: IoPath::Bounce,
            reason: Reason::None,
            transport: Transport::Unknown,
            eof: true,
            bounce_bytes: 4096,
        };
        let v = json(&t);
        assert_eq!(v["engine"]["name"], "compat");
        assert_eq!(v["engine"]["reason"], "no_module");
        assert_eq!(
            v["engine"]["why"],
            Engine::Compat(CompatReason::NoModule).explain()
        );
        assert_eq!(v["path"], IoPath::Bounce.name());
        assert_eq!(v["reason"], Reason::None.name());
        assert_eq!(v["why"], Reason::None.explain(Transport::Unknown));
        assert_eq!(
            (v["bytes"].as_u64(), v["eof"].as_bool()),
            (Some(4096), Some(true))
        );
        assert_eq!(json(&Engine::Module)["reason"], serde_json::Value::Null);

        let r = Report {
            bytes: 10,
            direct_bytes: 6,
            buffered_bytes: 4,
            ios: 2,
            threads: 3,
            ..Report::default()
        };
        let v = json(&r);
        assert_eq!(v["direct_bytes"], 6);
        assert_eq!(v["threads"], 3);
        assert!(
            v.get("latencies_ns").is_none(),
            "empty latencies are left out: {v}"
        );
        let v = json(&Settings::default());
        assert_eq!(v["page_cache"], "auto");
        assert_eq!(v["task_size"], Settings::default().task_size);

        let e = Error::OutOfMemoryRange {
            offset: 1,
            len: 2,
            size: 3,
        };
        let v = json(&e);
        assert_eq!(v["kind"], "out_of_memory_range");
        assert_eq!(v["message"], e.to_string());
        assert_eq!(v["errno"], "EOVERFLOW");
        assert_eq!(json(&Error::TooManyRegistrations)["errno"], "EMFILE");
        assert_eq!(
            json(&Error::Worker { what: "x" })["errno"],
            serde_json::Value::Null
        );
        let v = json(&Version {
            major: 1,
            minor: 2,
            patch: 3,
        });
        assert_eq!(v, "1.2.3");
    }
}
