"""`edged devices` lists what PortAudio sees (here a JACK dummy server), named as the config takes
names, and a name it prints opens in the daemon."""

from __future__ import annotations

import json
import subprocess
import sys

from support.daemon import Daemon

from edged.client import Client

JACK = "JACK Audio Connection Kit"
EDGED = [sys.executable, "-m", "edged"]


def test_the_devices_listed_are_portaudios_and_a_listed_name_opens_in_the_daemon(jack_server, sd, jack_device,
                                                                                 tmp_path):
    """1. `edged devices --json` lists each device PortAudio lists in this process (the JACK server's),
          with its index, name, host API, channels, rate, and the defaults.
       2. The table shows the same index and name.
       3. The daemon started with `--audio-device NAME` and `--input-device INDEX` as listed reaches
          READY with both streams open on that device, and `edged status` says so."""
    listed = subprocess.run([*EDGED, "devices", "--json"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    devices = json.loads(listed.stdout)
    apis = [api["name"] for api in sd.query_hostapis()]
    assert [(d["index"], d["name"], d["hostapi"], d["input_channels"], d["output_channels"])
            for d in devices["devices"]] == \
        [(i["index"], i["name"], apis[i["hostapi"]], i["max_input_channels"], i["max_output_channels"])
         for i in sd.query_devices()]
    (jack,) = [d for d in devices["devices"] if d["hostapi"] == JACK]
    assert (jack["index"], jack["select"], jack["default_samplerate"]) == (jack_device, "system", jack_server.rate)
    assert jack["default_output"] and devices["default_output"] == jack_device == sd.query_devices(kind="output")["index"]
    assert jack["default_input"] == (devices["default_input"] == jack_device)

    table = subprocess.run([*EDGED, "devices"], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.split("\n\n")[0].splitlines()
    assert header.split()[:2] == ["index", "name"]
    assert [str(jack_device), "system", "JACK", "Audio"] == next(r.split()[:4] for r in rows if JACK in r)

    daemon = Daemon(tmp_path, config='[events]\nlisten = "none"\n',
                    args=("--audio-device", jack["select"], "--input-device", str(jack["index"])))
    try:
        with Client(daemon.endpoint) as client:
            audio = client.status()["audio"]
        shown = subprocess.run([*EDGED, "status", "--endpoint", daemon.endpoint], capture_output=True, text=True,
                               timeout=60)
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    out, mic = audio["output"], audio["input"]
    assert (out["state"], out["configured"], out["device"]) == ("open", "system", "system"), out
    assert (mic["state"], mic["configured"], mic["device"]) == ("open", str(jack_device), "system"), mic
    rows = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert rows["speaker"].startswith(f"system at {jack_server.rate} Hz") and rows["microphone"].startswith("system")
