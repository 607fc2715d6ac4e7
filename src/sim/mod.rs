//! Simulated machines for `talboot demo` and the integration tests.
//!
//! * [`relocate`]: moves the rack's subnets onto loopback (127.0.x.y) so an unprivileged
//!   process can give every machine its own address.
//! * [`assets`]: stand-in boot files (catalogued kernel/initramfs sets, iPXE binaries).
//! * [`ipxe`]: the slice of iPXE's script language talboot's scripts use.
//! * [`machine`]: one machine's network boot on the wire (DHCP, TFTP, HTTP).

pub mod assets;
pub mod ipxe;
pub mod machine;
pub mod relocate;
