# `cmake --install` and a Debian package (CPack): the kvpush binary, its systemd units, an example
# environment file and the docs. `scripts/package.sh` builds the .deb and checks it (CI).
include(GNUInstallDirs)
install(TARGETS kvpush RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Units go to /lib/systemd/system (Debian's path for packaged units; CMAKE_INSTALL_PREFIX /usr).
install(FILES packaging/systemd/kvpush@.service packaging/systemd/kvpush-router.service
        DESTINATION lib/systemd/system)
install(FILES packaging/default.example DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
# The Grafana dashboard (docs/server.md, "Metrics"): import it with a Prometheus data source.
install(FILES packaging/grafana/kvpush-dashboard.json DESTINATION ${CMAKE_INSTALL_DATADIR}/kvpush/grafana)
install(FILES README.md docs/deployment.md docs/configuration.md docs/server.md docs/router.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "kvpush")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "kvpush")
set(CPACK_PACKAGE_CONTACT "kvpush maintainers <kvpush@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Push-based KV transfer for prefill/decode disaggregated LLM serving (OpenAI API, P/D router)")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
# Library dependencies from the binary's ELF needs (dpkg-shlibdeps), plus what the maintainer
# script and the units run.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${PROJECT_SOURCE_DIR}/packaging/debian/postinst")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
include(CPack)
