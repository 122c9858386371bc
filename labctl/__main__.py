from labctl.cli import main

main(prog_name="labctl")
