//! Opening an RDMA device: context, protection domain, port and GID.

use super::ibv::{
    ibv_alloc_pd, ibv_close_device, ibv_dealloc_pd, ibv_free_device_list, ibv_get_device_list,
    ibv_get_device_name, ibv_open_device, ibv_query_device, ibv_query_gid, query_port,
};
use super::{call_failed, errno};
use crate::error::{RingError, VerbsError};
use rdma_sys::*;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// An open RDMA device with one protection domain, bound to one port and
/// one GID index. Shared (`Arc`) by every connection of a process.
pub struct Device {
    pub(super) ctx: *mut ibv_context,
    pub(super) pd: *mut ibv_pd,
    pub(super) port: u8,
    pub(super) gid_index: u8,
    pub(super) gid: [u8; 16],
    pub(super) lid: u16,
    pub(super) mtu: u8,
    pub(super) max_qp_wr: u32,
    pub(super) max_cqe: u32,
    name: String,
    /// Registrations of the program's buffers for zero-copy sends
    /// (`regcache`), made on first use.
    pub(super) zc: OnceLock<Arc<super::regcache::ZcCache>>,
}

// SAFETY: libibverbs contexts and PDs are thread-safe (the library locks
// internally); the pointers are only freed in Drop, once.
unsafe impl Send for Device {}
// SAFETY: `&Device` reads fields fixed at open and passes `ctx`/`pd` to
// libibverbs, which locks internally; the one mutable part, `zc`, is a
// OnceLock over a mutex-guarded cache.
unsafe impl Sync for Device {}

/// Which device, and which GID of its port, a caller wants; `None`
/// leaves the choice to the library (`Device::open`, `Device::open_for`).
/// The shim and `verbscheck` fill it from `RINGSOCK_DEVICE` (a device
/// name, e.g. `rxe0`, `mlx5_0`) and `RINGSOCK_GID_INDEX`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceChoice {
    pub name: Option<String>,
    pub gid_index: Option<u8>,
}

impl Device {
    /// Opens the device `choice` names, else the first one with an active
    /// port; the GID `choice` names, else the port's default (the first
    /// IPv4-mapped RoCE v2 GID).
    pub fn open(choice: &DeviceChoice) -> Result<Arc<Device>, RingError> {
        Device::open_matching(choice.name.as_deref(), None, choice.gid_index)
    }

    /// Opens the device that carries RoCE v2 traffic towards `peer`: what
    /// `choice` names wins when it names anything (as for `open`);
    /// otherwise the device and port whose GID table holds a RoCE v2 entry
    /// for the local address the kernel would send to `peer` from, on the
    /// netdev that owns that address (`route`); otherwise, when no RDMA
    /// device owns the route, `open`'s default (the first device with an
    /// active port). Devices are cached per process by (name, port, GID
    /// index): connections share one context and protection domain, which
    /// close when the last connection using them is gone.
    pub fn open_for(peer: IpAddr, choice: &DeviceChoice) -> Result<Arc<Device>, RingError> {
        if choice.name.is_none() && choice.gid_index.is_none() {
            if let Some(r) = Device::route(peer) {
                let key = Key {
                    name: r.device.clone(),
                    port: r.port,
                    gid_index: r.gid_index,
                };
                return cached(Some(&key), None, || {
                    Device::open_named(&r.device, Some(r.port), Some(r.gid_index))
                });
            }
        }
        cached(None, Some(choice), || Device::open(choice))
    }

    /// Where RoCE v2 traffic to `peer` would go from, as the kernel routes
    /// it and sysfs describes the RDMA devices; `None` when no RDMA device
    /// has a RoCE v2 GID for that source address on its netdev (or the
    /// route cannot be found). No packet is sent.
    pub fn route(peer: IpAddr) -> Option<DeviceRoute> {
        let source = route_source(peer)?;
        let netdev = netdev_of(source)?;
        let (device, port, gid_index) =
            find_roce_gid(Path::new(SYSFS_IB), &netdev, &gid_of(source))?;
        Some(DeviceRoute {
            source,
            netdev,
            device,
            port,
            gid_index,
        })
    }

    /// Opens device `name`, on `port` (else its first active port), with
    /// GID `gid_index` (else the default choice).
    fn open_named(
        name: &str,
        port: Option<u8>,
        gid_index: Option<u8>,
    ) -> Result<Arc<Device>, RingError> {
        Device::open_matching(Some(name), port, gid_index)
    }

    fn open_matching(
        want: Option<&str>,
        port: Option<u8>,
        gid_index: Option<u8>,
    ) -> Result<Arc<Device>, RingError> {
        super::ibv::available().map_err(VerbsError::NoLibrary)?;
        let mut n = 0;
        // SAFETY: `n` is a live out-parameter; the list is freed below
        // (ibv_free_device_list), once.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(call_failed("ibv_get_device_list", errno()));
        }
        let mut found = Err(match want {
            Some(name) => VerbsError::NoSuchDevice(name.to_owned()).into(),
            None => VerbsError::NoDevice.into(),
        });
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is valid; the name is a C string owned by it.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if want.is_some_and(|want| want != name) {
                continue;
            }
            found = Device::open_one(dev, name, port, gid_index).map(Arc::new);
            if found.is_ok() || want.is_some() {
                break;
            }
        }
        // SAFETY: the list came from ibv_get_device_list; opened contexts
        // stay valid after it is freed.
        unsafe { ibv_free_device_list(list) };
        found
    }

    fn open_one(
        dev: *mut ibv_device,
        name: String,
        want_port: Option<u8>,
        gid_index: Option<u8>,
    ) -> Result<Device, RingError> {
        // SAFETY: dev comes from the device list, still alive.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(call_failed("ibv_open_device", errno()));
        }
        // SAFETY: `ctx` is the context just opened, not yet used by any
        // other thread. libibverbs reads both fields wherever it uses the
        // descriptors (commands, the provider's mmaps, ibv_close_device
        // closes them), so a moved number is used from here on.
        unsafe {
            (*ctx).cmd_fd = super::fdplace::place((*ctx).cmd_fd);
            (*ctx).async_fd = super::fdplace::place((*ctx).async_fd);
        }
        // From here on, `Device`'s Drop closes what was opened.
        let mut d = Device {
            ctx,
            pd: std::ptr::null_mut(),
            port: 0,
            gid_index: 0,
            gid: [0; 16],
            lid: 0,
            mtu: 0,
            max_qp_wr: 0,
            max_cqe: 0,
            name,
            zc: OnceLock::new(),
        };
        // SAFETY: zeroed is a valid ibv_device_attr; ctx is open.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx open, attr is a valid out-pointer.
        let rc = unsafe { ibv_query_device(ctx, &mut attr) };
        if rc != 0 {
            return Err(call_failed("ibv_query_device", rc));
        }
        d.max_qp_wr = attr.max_qp_wr.max(0) as u32;
        d.max_cqe = attr.max_cqe.max(0) as u32;
        let mut chosen = None;
        for port in 1..=attr.phys_port_cnt {
            if want_port.is_some_and(|p| p != port) {
                continue;
            }
            // SAFETY: zeroed is a valid ibv_port_attr.
            let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: ctx open, port in range, pa a valid out-pointer.
            if unsafe { query_port(ctx, port, &mut pa) } != 0 {
                continue;
            }
            if pa.state == ibv_port_state::IBV_PORT_ACTIVE {
                chosen = Some((port, pa));
                break;
            }
        }
        let Some((port, pa)) = chosen else {
            return Err(VerbsError::NoActivePort {
                device: d.name.clone(),
                port: want_port,
            }
            .into());
        };
        d.port = port;
        d.lid = pa.lid;
        d.mtu = pa.active_mtu as u8;
        let (idx, gid) = match gid_index {
            Some(i) => match query_gid(ctx, port, i) {
                Some(g) if g != [0; 16] => (i, g),
                _ => {
                    return Err(VerbsError::BadGid {
                        device: d.name.clone(),
                        port,
                        index: i,
                    }
                    .into())
                }
            },
            None => pick_gid(ctx, &d.name, port, pa.gid_tbl_len.clamp(0, 256) as u32).ok_or_else(
                || VerbsError::NoGid {
                    device: d.name.clone(),
                    port,
                },
            )?,
        };
        d.gid_index = idx;
        d.gid = gid;
        // SAFETY: `ctx` is the context opened above (Drop closes it); a
        // null result is handled below.
        d.pd = unsafe { ibv_alloc_pd(ctx) };
        if d.pd.is_null() {
            return Err(call_failed("ibv_alloc_pd", errno()));
        }
        Ok(d)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u8 {
        self.port
    }

    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }

    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // The zero-copy registrations live on our PD: deregister them
        // first, or the PD cannot be freed.
        if let Some(zc) = self.zc.get() {
            zc.clear();
        }
        // SAFETY: each pointer was created by the matching call and every
        // connection holds an Arc<Device>, so nothing uses them any more.
        unsafe {
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            ibv_close_device(self.ctx);
        }
    }
}

fn query_gid(ctx: *mut ibv_context, port: u8, index: u8) -> Option<[u8; 16]> {
    // SAFETY: ibv_gid is plain bytes; zeroed is valid.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: ctx open, gid a valid out-pointer.
    if unsafe { ibv_query_gid(ctx, port, index as i32, &mut gid) } != 0 {
        return None;
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    Some(unsafe { gid.raw })
}

/// Whether a GID is an IPv4-mapped address (`::ffff:a.b.c.d`).
pub fn is_ipv4_mapped(g: &[u8; 16]) -> bool {
    g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff
}

/// The GID type the kernel reports in sysfs ("IB/RoCE v1", "RoCE v2"), if
/// it does.
fn gid_type(dev: &str, port: u8, index: u32) -> Option<String> {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}"
    ))
    .ok()
    .map(|s| s.trim().to_owned())
}

/// Default GID choice: the first IPv4-mapped RoCE v2 GID, else the first
/// IPv4-mapped one, else the first non-zero one (InfiniBand).
fn pick_gid(ctx: *mut ibv_context, dev: &str, port: u8, len: u32) -> Option<(u8, [u8; 16])> {
    let gids: Vec<(u8, [u8; 16])> = (0..len.min(256))
        .filter_map(|i| query_gid(ctx, port, i as u8).map(|g| (i as u8, g)))
        .filter(|(_, g)| *g != [0; 16])
        .collect();
    let v4: Vec<_> = gids.iter().filter(|(_, g)| is_ipv4_mapped(g)).collect();
    v4.iter()
        .find(|(i, _)| gid_type(dev, port, *i as u32).as_deref() == Some("RoCE v2"))
        .or_else(|| v4.first())
        .map(|x| **x)
        .or_else(|| gids.first().copied())
}

/// What `Device::route` found: the local source address towards the peer,
/// the netdev that owns it, and the RDMA device, port and RoCE v2 GID
/// index for that address on that netdev.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRoute {
    pub source: IpAddr,
    pub netdev: String,
    pub device: String,
    pub port: u8,
    pub gid_index: u8,
}

const SYSFS_IB: &str = "/sys/class/infiniband";

/// The local address the kernel would send from to reach `peer`: connect
/// a UDP socket (routing only, no packet leaves) and ask for its name.
pub fn route_source(peer: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = match peer {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let s = std::net::UdpSocket::bind((any, 0)).ok()?;
    // Any port will do: connect() on UDP only picks the route and source.
    s.connect((peer, 4791)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The network interface that has `addr` configured (getifaddrs).
pub fn netdev_of(addr: IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: head is a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned, still allocated.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says its type.
        let fam = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let a: IpAddr = match fam {
            libc::AF_INET => {
                // SAFETY: AF_INET: a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into()
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6: a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into()
            }
            _ => continue,
        };
        if a == addr {
            // SAFETY: a NUL-terminated name owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: the list from getifaddrs, freed once; `found` owns its copy.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// The GID a RoCE v2 port has for a local address: IPv4 addresses as
/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`), IPv6 addresses as they are.
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// Parses a GID as sysfs prints it (`0000:0000:0000:0000:0000:ffff:0a09:0001`).
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let mut g = [0u8; 16];
    let mut n = 0;
    for part in s.trim().split(':') {
        if n == 8 || part.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(part, 16).ok()?;
        g[2 * n..2 * n + 2].copy_from_slice(&v.to_be_bytes());
        n += 1;
    }
    (n == 8).then_some(g)
}

/// Searches a sysfs `infiniband` class directory (`root`) for a RoCE v2
/// GID equal to `gid` on netdev `netdev`: `root/DEV/ports/P/gids/N`,
/// `.../gid_attrs/types/N` ("RoCE v2"), `.../gid_attrs/ndevs/N`. Devices,
/// ports and indexes are tried in ascending order; the first match wins.
pub fn find_roce_gid(root: &Path, netdev: &str, gid: &[u8; 16]) -> Option<(String, u8, u8)> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut devs: Vec<String> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    devs.sort();
    for dev in devs {
        let ports_dir = root.join(&dev).join("ports");
        let mut ports: Vec<u8> = match std::fs::read_dir(&ports_dir) {
            Ok(d) => d
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect(),
            Err(_) => continue,
        };
        ports.sort();
        for port in ports {
            let pd = ports_dir.join(port.to_string());
            let mut idx: Vec<u8> = match std::fs::read_dir(pd.join("gids")) {
                Ok(d) => d
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect(),
                Err(_) => continue,
            };
            idx.sort();
            for i in idx {
                let n = i.to_string();
                if read(&pd.join("gids").join(&n)).and_then(|g| parse_gid(&g)) != Some(*gid) {
                    continue;
                }
                // Unset entries fail to read (EINVAL): no match.
                let ty = read(&pd.join("gid_attrs/types").join(&n));
                let nd = read(&pd.join("gid_attrs/ndevs").join(&n));
                if ty.as_deref().map(str::trim) == Some("RoCE v2")
                    && nd.as_deref().map(str::trim) == Some(netdev)
                {
                    return Some((dev, port, i));
                }
            }
        }
    }
    None
}

/// Per-process cache of open devices.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    name: String,
    port: u8,
    gid_index: u8,
}

/// A `DeviceChoice` as a cache key: (device name, GID index).
type ChoiceKey = (Option<String>, Option<u8>);

struct Cache {
    /// The process the entries belong to: a forked child starts afresh (a
    /// verbs context is not usable across fork).
    pid: u32,
    devices: Vec<(Key, Weak<Device>)>,
    /// What an environment/default choice resolved to last time.
    choices: Vec<(ChoiceKey, Key)>,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    pid: 0,
    devices: Vec::new(),
    choices: Vec::new(),
});

/// Returns the live cached device for `key` (or for what `choice` resolved
/// to before), else opens one with `open` and caches it.
fn cached(
    key: Option<&Key>,
    choice: Option<&DeviceChoice>,
    open: impl FnOnce() -> Result<Arc<Device>, RingError>,
) -> Result<Arc<Device>, RingError> {
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if c.pid != pid {
        // Inherited entries point at the parent's contexts: forget them
        // (the Weak handles free nothing).
        c.pid = pid;
        c.devices.clear();
        c.choices.clear();
    }
    c.devices.retain(|(_, w)| w.strong_count() > 0);
    let ckey = choice.map(|ch| (ch.name.clone(), ch.gid_index));
    let want = key.cloned().or_else(|| {
        let ck = ckey.as_ref()?;
        c.choices
            .iter()
            .find(|(k, _)| k == ck)
            .map(|(_, v)| v.clone())
    });
    if let Some(w) = want {
        if let Some(d) = c
            .devices
            .iter()
            .find(|(k, _)| *k == w)
            .and_then(|(_, d)| d.upgrade())
        {
            return Ok(d);
        }
    }
    // Opening under the lock: two threads asking at once get one context.
    let d = open()?;
    let k = Key {
        name: d.name.clone(),
        port: d.port,
        gid_index: d.gid_index,
    };
    if let Some(existing) = c
        .devices
        .iter()
        .find(|(e, _)| *e == k)
        .and_then(|(_, w)| w.upgrade())
    {
        // Resolved to a device already open under a different request.
        if let Some(ck) = ckey {
            c.choices.retain(|(e, _)| *e != ck);
            c.choices.push((ck, k));
        }
        return Ok(existing);
    }
    c.devices.push((k.clone(), Arc::downgrade(&d)));
    if let Some(ck) = ckey {
        c.choices.retain(|(e, _)| *e != ck);
        c.choices.push((ck, k));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn gids_of_addresses() {
        let g = gid_of("10.9.0.1".parse().unwrap());
        assert!(is_ipv4_mapped(&g));
        assert_eq!(g[12..], [10, 9, 0, 1]);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(gid_of(v6)[0..2], [0xfe, 0x80]);
        assert!(!is_ipv4_mapped(&gid_of(v6)));
    }

    #[test]
    fn parses_sysfs_gids() {
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:0a09:0001\n").unwrap();
        assert_eq!(g, gid_of("10.9.0.1".parse().unwrap()));
        assert_eq!(
            parse_gid("fe80:0000:0000:0000:307d:06ff:febf:7ec1").unwrap()[..2],
            [0xfe, 0x80]
        );
        for bad in [
            "",
            "0000:0000",
            "0000:0000:0000:0000:0000:ffff:0a09:0001:0000",
            "000g:0000:0000:0000:0000:ffff:0a09:0001",
            "0:0:0:0:0:ffff:a09:1",
        ] {
            assert_eq!(parse_gid(bad), None, "{bad}");
        }
    }

    /// A fake `/sys/class/infiniband` tree.
    struct Tree(std::path::PathBuf);

    impl Tree {
        fn new(tag: &str) -> Tree {
            let p = std::env::temp_dir().join(format!(
                "ringsock-sysfs-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Tree(p)
        }
        /// One GID entry; `ty`/`ndev` None: the file exists but reads fail
        /// like sysfs's EINVAL for unset entries (here: a directory).
        fn gid(&self, dev: &str, port: u8, i: u8, gid: &str, ty: Option<&str>, ndev: Option<&str>) {
            let pd = self.0.join(dev).join("ports").join(port.to_string());
            for d in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
                fs::create_dir_all(pd.join(d)).unwrap();
            }
            fs::write(pd.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
            let put = |d: &str, v: Option<&str>| {
                let f = pd.join(d).join(i.to_string());
                match v {
                    Some(v) => fs::write(f, format!("{v}\n")).unwrap(),
                    None => fs::create_dir_all(f).unwrap(),
                }
            };
            put("gid_attrs/types", ty);
            put("gid_attrs/ndevs", ndev);
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const A1: &str = "0000:0000:0000:0000:0000:ffff:0a09:0001";
    const B2: &str = "0000:0000:0000:0000:0000:ffff:0a09:0002";
    const LL: &str = "fe80:0000:0000:0000:307d:06ff:febf:7ec1";

    #[test]
    fn finds_the_roce_v2_gid_of_the_route() {
        let t = Tree::new("find");
        for (dev, ll, v4, nd) in [("rxeA", LL, A1, "vethA"), ("rxeB", LL, B2, "vethB")] {
            t.gid(dev, 1, 0, ll, Some("RoCE v2"), Some(nd));
            // RoCE v1 entry for the same address first: must be skipped.
            t.gid(dev, 1, 1, v4, Some("IB/RoCE v1"), Some(nd));
            t.gid(dev, 1, 2, v4, Some("RoCE v2"), Some(nd));
            t.gid(
                dev,
                1,
                3,
                "0000:0000:0000:0000:0000:0000:0000:0000",
                None,
                None,
            );
        }
        let b = gid_of("10.9.0.2".parse().unwrap());
        assert_eq!(
            find_roce_gid(&t.0, "vethB", &b),
            Some(("rxeB".into(), 1, 2))
        );
        let a = gid_of("10.9.0.1".parse().unwrap());
        assert_eq!(
            find_roce_gid(&t.0, "vethA", &a),
            Some(("rxeA".into(), 1, 2))
        );
        // Right address, wrong netdev; unknown address: no device owns it.
        assert_eq!(find_roce_gid(&t.0, "vethA", &b), None);
        let c = gid_of("10.9.0.3".parse().unwrap());
        assert_eq!(find_roce_gid(&t.0, "vethA", &c), None);
        // The link-local GID matches on both devices' netdevs.
        let ll = parse_gid(LL).unwrap();
        assert_eq!(
            find_roce_gid(&t.0, "vethB", &ll),
            Some(("rxeB".into(), 1, 0))
        );
    }

    #[test]
    fn odd_trees_are_no_match() {
        let t = Tree::new("odd");
        // Unreadable attributes, junk names, a missing ports dir, port 2.
        t.gid("mlx5_0", 2, 5, A1, None, None);
        fs::create_dir_all(t.0.join("junk")).unwrap();
        fs::create_dir_all(t.0.join("mlx5_0/ports/notaport/gids")).unwrap();
        fs::write(t.0.join("mlx5_0/ports/2/gids/x"), "garbage").unwrap();
        let a = gid_of("10.9.0.1".parse().unwrap());
        assert_eq!(find_roce_gid(&t.0, "eth0", &a), None);
        t.gid("mlx5_0", 2, 7, A1, Some("RoCE v2"), Some("eth0"));
        assert_eq!(
            find_roce_gid(&t.0, "eth0", &a),
            Some(("mlx5_0".into(), 2, 7))
        );
        assert_eq!(find_roce_gid(&t.0.join("nonexistent"), "eth0", &a), None);
    }

    #[test]
    fn loopback_route_and_netdev() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(route_source(lo), Some(lo));
        assert_eq!(netdev_of(lo).as_deref(), Some("lo"));
        assert_eq!(netdev_of("192.0.2.77".parse().unwrap()), None);
    }
}
