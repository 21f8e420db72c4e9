// Node-RED headless for tests/nodered: no editor, no admin API, no HTTP nodes; the flow file
// and the user folder come from the command line, the broker from MQTT_HOST and MQTT_PORT.
module.exports = {
    uiPort: Number(process.env.NODE_RED_PORT || 1880),
    uiHost: "127.0.0.1",
    httpAdminRoot: false,
    httpNodeRoot: false,
    credentialSecret: false,
    flowFilePretty: true,
    logging: {console: {level: "info", metrics: false, audit: false}},
    functionGlobalContext: {},
    externalModules: {autoInstall: false, palette: {allowInstall: false}, modules: {allowInstall: false}},
};
