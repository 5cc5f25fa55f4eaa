import sys

from fabric_emu.agent.main import main

sys.exit(main(sys.argv[1:]))
