import sys

from fabric_emu.nic.main import main

sys.exit(main(sys.argv[1:]))
