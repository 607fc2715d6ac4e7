"""An IPMI 2.0 LAN (RMCP+) BMC on pyghmi's server side, the BMC virtualbmc is built on.

Used by tests/power.rs as a second real IPMI peer beside OpenIPMI's ipmi_sim. pyghmi answers
no RMCP/ASF presence ping (pyghmi/ipmi/private/serversession.py, IpmiServer.sessionless_data
only handles IPMI-class packets), so a client that needs the pong cannot open a session.

pyghmi's own Bmc.set_system_boot_options keeps only the device selector (data byte 2 bits
5:2) and drops data byte 1 (valid, persistent, EFI), so this subclass records the raw request
bytes of Set System Boot Options before handing them on.

Usage: pyghmi_bmc.py ADDRESS PORT USER PASSWORD STATE_DIR
STATE_DIR/log gets one line per change: `power on|off|cycle` and `bootflags <hex bytes>`.
"""

import os
import sys

import pyghmi.ipmi.bmc as bmc


class RecordingBmc(bmc.Bmc):
    def __init__(self, authdata, port, address, state_dir):
        super().__init__(authdata, port=port, address=address)
        self.state_dir = state_dir
        self.power = "off"
        self.boot = "default"

    def _log(self, line):
        with open(os.path.join(self.state_dir, "log"), "a") as f:
            f.write(line + "\n")

    def get_power_state(self):
        return self.power

    def power_on(self):
        self.power = "on"
        self._log("power on")

    def power_off(self):
        self.power = "off"
        self._log("power off")

    def power_cycle(self):
        self.power = "on"
        self._log("power cycle")

    def get_boot_device(self):
        return self.boot

    def set_boot_device(self, bootdevice):
        self.boot = bootdevice

    def set_system_boot_options(self, request, session):
        if request["data"] and request["data"][0] == 5:
            self._log("bootflags " + " ".join("%02x" % b for b in request["data"]))
        return super().set_system_boot_options(request, session)


def main():
    address, port, user, password, state_dir = sys.argv[1:6]
    server = RecordingBmc({user: password}, int(port), address, state_dir)
    # The test waits for this file before it talks to the BMC.
    with open(os.path.join(state_dir, "ready"), "w") as f:
        f.write("listening\n")
    server.listen(timeout=30)


if __name__ == "__main__":
    main()
