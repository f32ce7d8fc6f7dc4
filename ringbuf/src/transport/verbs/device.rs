//! Opening an RDMA device: context, protection domain, port and GID.

use crate::error::RingError;
use rdma_sys::*;
use std::ffi::CStr;
use std::sync::Arc;

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
}

// SAFETY: libibverbs contexts and PDs are thread-safe (the library locks
// internally); the pointers are only freed in Drop, once.
unsafe impl Send for Device {}
// SAFETY: as above; `Device` exposes no interior mutation of its own.
unsafe impl Sync for Device {}

/// How to choose the device; `from_env` reads `RINGSOCK_DEVICE` (device
/// name, e.g. `rxe0`, `mlx5_0`) and `RINGSOCK_GID_INDEX`.
#[derive(Clone, Debug, Default)]
pub struct DeviceChoice {
    pub name: Option<String>,
    pub gid_index: Option<u8>,
}

impl DeviceChoice {
    pub fn from_env() -> Result<Self, RingError> {
        let name = std::env::var("RINGSOCK_DEVICE")
            .ok()
            .filter(|s| !s.is_empty());
        let gid_index = match std::env::var("RINGSOCK_GID_INDEX") {
            Ok(s) if !s.is_empty() => Some(
                s.trim()
                    .parse::<u8>()
                    .map_err(|_| RingError::Config("RINGSOCK_GID_INDEX must be in 0..=255"))?,
            ),
            _ => None,
        };
        Ok(DeviceChoice { name, gid_index })
    }
}

impl Device {
    /// Opens the device named by the environment, or the first one with an
    /// active port (see `DeviceChoice::from_env`).
    pub fn open() -> Result<Arc<Device>, RingError> {
        Device::open_with(&DeviceChoice::from_env()?)
    }

    pub fn open_with(choice: &DeviceChoice) -> Result<Arc<Device>, RingError> {
        let mut n = 0;
        // SAFETY: plain library call; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(RingError::Config(
                "verbs: ibv_get_device_list failed (no RDMA support in this kernel, or \
                 no provider library for the device)",
            ));
        }
        let mut found = Err(match choice.name {
            Some(_) => {
                RingError::Config("verbs: the device named by RINGSOCK_DEVICE does not exist")
            }
            None => RingError::Config("verbs: no RDMA device found"),
        });
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is valid; the name is a C string owned by it.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if choice.name.as_ref().is_some_and(|want| *want != name) {
                continue;
            }
            found = Device::open_one(dev, name, choice.gid_index).map(Arc::new);
            if found.is_ok() || choice.name.is_some() {
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
        gid_index: Option<u8>,
    ) -> Result<Device, RingError> {
        // SAFETY: dev comes from the device list, still alive.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(RingError::Config("verbs: ibv_open_device failed"));
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
        };
        // SAFETY: zeroed is a valid ibv_device_attr; ctx is open.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx open, attr is a valid out-pointer.
        if unsafe { ibv_query_device(ctx, &mut attr) } != 0 {
            return Err(RingError::Config("verbs: ibv_query_device failed"));
        }
        d.max_qp_wr = attr.max_qp_wr.max(0) as u32;
        d.max_cqe = attr.max_cqe.max(0) as u32;
        let mut chosen = None;
        for port in 1..=attr.phys_port_cnt {
            // SAFETY: zeroed is a valid ibv_port_attr.
            let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: ctx open, port in range, pa a valid out-pointer.
            if unsafe { ___ibv_query_port(ctx, port, &mut pa) } != 0 {
                continue;
            }
            if pa.state == ibv_port_state::IBV_PORT_ACTIVE {
                chosen = Some((port, pa));
                break;
            }
        }
        let Some((port, pa)) = chosen else {
            return Err(RingError::Config("verbs: the device has no active port"));
        };
        d.port = port;
        d.lid = pa.lid;
        d.mtu = pa.active_mtu as u8;
        let (idx, gid) = match gid_index {
            Some(i) => match query_gid(ctx, port, i) {
                Some(g) if g != [0; 16] => (i, g),
                _ => {
                    return Err(RingError::Config(
                        "verbs: RINGSOCK_GID_INDEX names an empty or invalid GID",
                    ))
                }
            },
            None => pick_gid(ctx, &d.name, port, pa.gid_tbl_len.clamp(0, 256) as u32)
                .ok_or(RingError::Config("verbs: the port has no usable GID"))?,
        };
        d.gid_index = idx;
        d.gid = gid;
        // SAFETY: ctx open.
        d.pd = unsafe { ibv_alloc_pd(ctx) };
        if d.pd.is_null() {
            return Err(RingError::Config("verbs: ibv_alloc_pd failed"));
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
