from fgdata.cli.main import run

run()
