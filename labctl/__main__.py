from labctl.cli.app import main

main(prog_name="labctl")
