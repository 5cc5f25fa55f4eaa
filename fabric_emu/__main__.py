from fabric_emu.cli import main

main()
